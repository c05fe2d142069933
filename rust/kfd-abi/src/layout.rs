//! Kernel layouts that `linux/kfd_ioctl.h` does not carry, and compile-time checks of the
//! ones it does.
//!
//! The CRIU private-data blob is opaque to user space, but an emulator must produce and
//! consume it and a checker must be able to walk it; its sections follow each other with no
//! padding, little endian, in this order: process, devices, BOs, then `num_objects` objects
//! (queues, events, SVM ranges) each starting with a `u32` object type.

#![allow(non_camel_case_types)]

use crate::sys;
use core::mem::{offset_of, size_of};

/// `KFD_CRIU_PRIV_VERSION`: the only blob version kernels have produced.
pub const KFD_CRIU_PRIV_VERSION: u32 = 1;
/// "No dmabuf fd" in a BO bucket.
pub const KFD_INVALID_FD: u32 = 0xffff_ffff;

/// `kfd_criu_op` values.
pub mod criu_op {
    /// Sizes of the process' CRIU state (queues paused first).
    pub const PROCESS_INFO: u32 = 0;
    /// Writes the buckets and the private blob.
    pub const CHECKPOINT: u32 = 1;
    /// Lets the paused queues run again.
    pub const UNPAUSE: u32 = 2;
    /// Recreates the process' BOs, queues and events from the blob.
    pub const RESTORE: u32 = 3;
    /// Starts the restored queues (called by the restored process itself).
    pub const RESUME: u32 = 4;
}

/// Object types at the head of each object record in the blob.
pub mod object_type {
    /// A [`super::kfd_criu_queue_priv_data`].
    pub const QUEUE: u32 = 0;
    /// A [`super::kfd_criu_event_priv_data`].
    pub const EVENT: u32 = 1;
    /// A [`super::kfd_criu_svm_range_priv_data`].
    pub const SVM_RANGE: u32 = 2;
}

/// `AMDKFD_IOC_EXPORT_DMABUF` arguments (KFD 1.12, Linux 6.3; newer than bookworm's header).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kfd_ioctl_export_dmabuf_args {
    /// The BO (KFD's handle from ALLOC_MEMORY_OF_GPU).
    pub handle: u64,
    /// Open flags of the dma-buf file (`O_CLOEXEC`, `O_RDWR`).
    pub flags: u32,
    /// Out: the new dma-buf fd.
    pub dmabuf_fd: u32,
}

/// Linux 6.18's render-node GEM uapi, newer than bookworm's `drm.h` and `amdgpu_drm.h`
/// (layouts from the kernel's `include/uapi/drm/`).
pub mod gem618 {
    /// `DRM_AMDGPU_GEM_LIST_HANDLES`' number after `DRM_COMMAND_BASE`.
    pub const DRM_AMDGPU_GEM_LIST_HANDLES: u32 = 0x19;
    /// `DRM_IOCTL_GEM_CHANGE_HANDLE`'s core number.
    pub const DRM_GEM_CHANGE_HANDLE: u32 = 0xd2;
    /// `AMDGPU_GEM_OP_GET_MAPPING_INFO`.
    pub const AMDGPU_GEM_OP_GET_MAPPING_INFO: u32 = 2;
    /// `AMDGPU_VM_MAX_NUM_CTX` (amdgpu_vm.h): context ids lie below it.
    pub const AMDGPU_VM_MAX_NUM_CTX: u32 = 4096;
    /// `AMDGPU_VM_PAGE_NOALLOC` (6.0).
    pub const AMDGPU_VM_PAGE_NOALLOC: u32 = 1 << 9;
    /// The flags GEM_VA MAP takes for a BO mapping (amdgpu_gem_va_ioctl's
    /// `valid_flags`: DELAY_UPDATE, READABLE, WRITEABLE, EXECUTABLE, the MTYPE
    /// field, NOALLOC).  GET_MAPPING_INFO reports a mapping's flags as given
    /// (6.18 keeps the uapi flags in the mapping since "rework how PTE flags
    /// are generated").
    pub const AMDGPU_VM_MAP_FLAGS: u32 =
        1 | 1 << 1 | 1 << 2 | 1 << 3 | 0xf << 5 | AMDGPU_VM_PAGE_NOALLOC;
    /// `AMDGPU_GEM_LIST_HANDLES_FLAG_IS_IMPORT`: the BO is another device's dma-buf.
    pub const AMDGPU_GEM_LIST_HANDLES_FLAG_IS_IMPORT: u32 = 1 << 0;
    /// `AMDGPU_GEM_DOMAIN_DOORBELL` (6.8).
    pub const AMDGPU_GEM_DOMAIN_DOORBELL: u32 = 0x40;
    /// `AMDGPU_GEM_DOMAIN_MMIO_REMAP` (6.18).
    pub const AMDGPU_GEM_DOMAIN_MMIO_REMAP: u32 = 0x80;
    /// `AMDGPU_GEM_DOMAIN_MASK` of 6.18.
    pub const AMDGPU_GEM_DOMAIN_MASK: u32 = 0xff;
    /// `AMDGPU_GEM_CREATE_DISCARDABLE` (6.1).
    pub const AMDGPU_GEM_CREATE_DISCARDABLE: u64 = 1 << 12;
    /// `AMDGPU_GEM_CREATE_COHERENT` (6.3).
    pub const AMDGPU_GEM_CREATE_COHERENT: u64 = 1 << 13;
    /// `AMDGPU_GEM_CREATE_UNCACHED` (6.3).
    pub const AMDGPU_GEM_CREATE_UNCACHED: u64 = 1 << 14;
    /// `AMDGPU_GEM_CREATE_EXT_COHERENT` (6.8).
    pub const AMDGPU_GEM_CREATE_EXT_COHERENT: u64 = 1 << 15;
    /// `AMDGPU_GEM_CREATE_GFX12_DCC` (6.11).
    pub const AMDGPU_GEM_CREATE_GFX12_DCC: u64 = 1 << 16;
    /// `AMDGPU_GEM_CREATE_SETTABLE_MASK` (amdgpu_gem.h, 6.18): the flags GEM_CREATE
    /// takes and GEM_LIST_HANDLES reports.
    pub const AMDGPU_GEM_CREATE_SETTABLE_MASK: u64 = 1 // CPU_ACCESS_REQUIRED
        | 1 << 1 // NO_CPU_ACCESS
        | 1 << 2 // CPU_GTT_USWC
        | 1 << 3 // VRAM_CLEARED
        | 1 << 6 // VM_ALWAYS_VALID
        | 1 << 7 // EXPLICIT_SYNC
        | 1 << 9 // VRAM_WIPE_ON_RELEASE
        | 1 << 10 // ENCRYPTED
        | AMDGPU_GEM_CREATE_DISCARDABLE
        | AMDGPU_GEM_CREATE_COHERENT
        | AMDGPU_GEM_CREATE_UNCACHED
        | AMDGPU_GEM_CREATE_EXT_COHERENT
        | AMDGPU_GEM_CREATE_GFX12_DCC;

    /// `struct drm_gem_change_handle` (drm.h, 6.18).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct drm_gem_change_handle {
        /// The object's handle now.
        pub handle: u32,
        /// The handle it is to have.
        pub new_handle: u32,
    }

    /// `struct drm_amdgpu_gem_op` of 6.18 (24 bytes; 16 before, without the entry count).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct drm_amdgpu_gem_op {
        /// GEM handle.
        pub handle: u32,
        /// `AMDGPU_GEM_OP_*`.
        pub op: u32,
        /// In or out value; for GET_MAPPING_INFO the user address of the entries.
        pub value: u64,
        /// GET_MAPPING_INFO: in, the entries' room; out, the mappings there are.
        pub num_entries: u32,
        /// Must be 0.
        pub padding: u32,
    }

    /// `struct drm_amdgpu_gem_vm_entry`: one GPU VA mapping of a BO.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct drm_amdgpu_gem_vm_entry {
        /// GPU VA of the mapping.
        pub addr: u64,
        /// Bytes mapped.
        pub size: u64,
        /// Offset into the BO.
        pub offset: u64,
        /// The `AMDGPU_VM_PAGE_*` flags of the GEM_VA that made it.
        pub flags: u64,
    }

    /// `struct drm_amdgpu_gem_list_handles`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct drm_amdgpu_gem_list_handles {
        /// User address of the entries.
        pub entries: u64,
        /// In: the entries' room (0: only count); out: the handles the file has.
        pub num_entries: u32,
        /// Padding.
        pub padding: u32,
    }

    /// `struct drm_amdgpu_gem_list_handles_entry` (40 bytes).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct drm_amdgpu_gem_list_handles_entry {
        /// The GEM handle.
        pub gem_handle: u32,
        /// `AMDGPU_GEM_LIST_HANDLES_FLAG_*`.
        pub flags: u32,
        /// BO size in bytes.
        pub size: u64,
        /// `AMDGPU_GEM_DOMAIN_*` the BO prefers.
        pub preferred_domains: u64,
        /// Its `AMDGPU_GEM_CREATE_*` flags (within the settable mask).
        pub alloc_flags: u64,
        /// Its alignment in pages (`tbo.page_alignment`; GET_GEM_CREATE_INFO gives bytes).
        pub alignment: u64,
    }
}

/// `AMDKFD_IOC_RUNTIME_ENABLE` arguments (KFD 1.13, Linux 6.4).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kfd_ioctl_runtime_enable_args {
    /// The runtime's `r_debug` (shared with a debugger).
    pub r_debug: u64,
    /// [`runtime_enable`] mode bits: ENABLE (else disable), TTMP_SAVE.
    pub mode_mask: u32,
    /// Out: what KFD supports (no bit defined so far).
    pub capabilities_mask: u32,
}

/// `kfd_ioctl_runtime_enable_args.mode_mask` bits.
pub mod runtime_enable {
    /// Enable the runtime (clear: disable).
    pub const MODE_ENABLE: u32 = 1;
    /// Set up the trap temporaries (ignored on disable).
    pub const MODE_TTMP_SAVE: u32 = 2;
}

/// `AMDKFD_IOC_DBG_TRAP` arguments (KFD 1.13): the target pid, the operation, and a union
/// of per-operation arguments, 24 bytes at most.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kfd_ioctl_dbg_trap_args {
    /// The process to debug.
    pub pid: u32,
    /// A [`dbg_trap_op`] value.
    pub op: u32,
    /// The operation's arguments (`enable`: exception_mask, rinfo_ptr, rinfo_size | dbg_fd).
    pub args: [u64; 3],
}

/// `kfd_dbg_trap_operations`.
pub mod dbg_trap_op {
    /// Start a debug session.
    pub const ENABLE: u32 = 0;
    /// End it.
    pub const DISABLE: u32 = 1;
    /// The last operation number.
    pub const LAST: u32 = 14;
    /// The operations that drive debug hardware (`DBG_HW_OP`): wave launch override and mode,
    /// suspend and resume queues, set and clear address watches.
    pub const HW_OPS: [u32; 6] = [4, 5, 6, 7, 8, 9];
}

/// The blob's process record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kfd_criu_process_priv_data {
    /// [`KFD_CRIU_PRIV_VERSION`].
    pub version: u32,
    /// The process' XNACK mode (0 off, 1 on).
    pub xnack_mode: u32,
}

/// The blob's record of each device.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kfd_criu_device_priv_data {
    /// Unused by every kernel so far.
    pub reserved: u64,
}

/// A BO record; `N` is the kernel's `MAX_GPU_INSTANCE`: 16 on older kernels (80 bytes),
/// 64 since the MI300 multi-partition change (272 bytes). The blob carries no marker of which.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kfd_criu_bo_priv_data<const N: usize> {
    /// The BO's GPU virtual address (its CPU address for USERPTR BOs).
    pub user_addr: u64,
    /// The BO's handle in the process' IDR, kept across restore.
    pub idr_handle: u32,
    /// The GPUs the BO is mapped on, zero padded.
    pub mapped_gpuids: [u32; N],
}

impl<const N: usize> Default for kfd_criu_bo_priv_data<N> {
    fn default() -> Self {
        Self {
            user_addr: 0,
            idr_handle: 0,
            mapped_gpuids: [0; N],
        }
    }
}

/// A BO record of kernels with `MAX_GPU_INSTANCE` 16.
pub type kfd_criu_bo_priv_data16 = kfd_criu_bo_priv_data<16>;
/// A BO record of kernels with `MAX_GPU_INSTANCE` 64.
pub type kfd_criu_bo_priv_data64 = kfd_criu_bo_priv_data<64>;

/// A queue record of the blob (its MQD and control stack follow).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kfd_criu_queue_priv_data {
    /// The record's [`object_type`].
    pub object_type: u32,
    /// Padding.
    pub pad0: u32,
    /// The ring's GPU address.
    pub q_address: u64,
    /// The ring's size in bytes.
    pub q_size: u64,
    /// Where the queue's read pointer lives.
    pub read_ptr_addr: u64,
    /// Where the queue's write pointer lives.
    pub write_ptr_addr: u64,
    /// The doorbell's offset in the doorbell page.
    pub doorbell_off: u64,
    /// The end-of-pipe buffer's GPU address.
    pub eop_ring_buffer_address: u64,
    /// The context save/restore area's GPU address.
    pub ctx_save_restore_area_address: u64,
    /// The GPU the queue runs on.
    pub gpu_id: u32,
    /// The kernel's queue or event type.
    pub type_: u32,
    /// The queue format (PM4, AQL).
    pub format: u32,
    /// The queue id, kept across restore.
    pub q_id: u32,
    /// The queue priority.
    pub priority: u32,
    /// The queue's share of the GPU, in percent.
    pub q_percent: u32,
    /// The doorbell index.
    pub doorbell_id: u32,
    /// Whether the queue holds global wave sync resources.
    pub gws: u32,
    /// The SDMA engine of an SDMA queue.
    pub sdma_id: u32,
    /// The end-of-pipe buffer's size.
    pub eop_ring_buffer_size: u32,
    /// The context save/restore area's size.
    pub ctx_save_restore_area_size: u32,
    /// The control stack's size.
    pub ctl_stack_size: u32,
    /// Bytes of MQD (and control stack) following this record.
    pub mqd_size: u32,
    /// Padding.
    pub pad1: u32,
}

/// An event record of the blob.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kfd_criu_event_priv_data {
    /// The record's [`object_type`].
    pub object_type: u32,
    /// Padding.
    pub pad0: u32,
    /// The event page slot address the process gave.
    pub user_handle: u64,
    /// The event id, kept across restore.
    pub event_id: u32,
    /// Whether a wait resets the event.
    pub auto_reset: u32,
    /// The kernel's queue or event type.
    pub type_: u32,
    /// Whether the event was signaled.
    pub signaled: u32,
    /// `kfd_hsa_memory_exception_data` or `kfd_hsa_hw_exception_data`.
    pub exception_data: [u8; 32],
}

/// An SVM range record of the blob (its attributes follow).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kfd_criu_svm_range_priv_data {
    /// The record's [`object_type`].
    pub object_type: u32,
    /// Padding.
    pub pad0: u32,
    /// The range's first byte.
    pub start_addr: u64,
    /// The range's size in bytes.
    pub size: u64,
}

/// The kernel's encoding of `/dev/kfd` mmap offsets: type in bits 63..62, gpu_id in 61..46.
/// Real KFD hands these out; an emulator on a regular file cannot (offsets ≥ 2^63 fail with
/// EOVERFLOW there) and uses its own, so product code must only ever use returned offsets.
pub mod kfd_mmap {
    /// Where the type bits start.
    pub const TYPE_SHIFT: u32 = 62;
    /// The MMIO remap page.
    pub const TYPE_MMIO: u64 = 0;
    /// Reserved memory (CWSR areas).
    pub const TYPE_RESERVED_MEM: u64 = 1 << TYPE_SHIFT;
    /// The events page.
    pub const TYPE_EVENTS: u64 = 2 << TYPE_SHIFT;
    /// A GPU's doorbell pages.
    pub const TYPE_DOORBELL: u64 = 3 << TYPE_SHIFT;
    /// The type bits.
    pub const TYPE_MASK: u64 = 3 << TYPE_SHIFT;
    /// Where the gpu_id bits start.
    pub const GPU_ID_SHIFT: u32 = 46;
    /// The gpu_id bits.
    pub const GPU_ID_MASK: u64 = 0xffff << GPU_ID_SHIFT;

    /// The gpu_id bits of an offset for GPU `id`.
    pub const fn gpu_id(id: u32) -> u64 {
        ((id as u64) << GPU_ID_SHIFT) & GPU_ID_MASK
    }
    /// The gpu_id an offset names.
    pub const fn get_gpu_id(offset: u64) -> u32 {
        ((offset & GPU_ID_MASK) >> GPU_ID_SHIFT) as u32
    }
}

macro_rules! layout {
    ($ty:ty, $size:expr $(, $field:ident @ $off:expr)*) => {
        const _: () = assert!(size_of::<$ty>() == $size, concat!("size of ", stringify!($ty)));
        $(const _: () = assert!(offset_of!($ty, $field) == $off,
            concat!(stringify!($ty), ".", stringify!($field)));)*
    };
}

// The CRIU uapi (unchanged since KFD 1.7).
layout!(sys::kfd_ioctl_criu_args, 56, devices @ 0, bos @ 8, priv_data @ 16, priv_data_size @ 24,
    num_devices @ 32, num_bos @ 36, num_objects @ 40, pid @ 44, op @ 48);
layout!(sys::kfd_criu_device_bucket, 16, user_gpu_id @ 0, actual_gpu_id @ 4, drm_fd @ 8);
layout!(sys::kfd_criu_bo_bucket, 48, addr @ 0, size @ 8, offset @ 16, restored_offset @ 24,
    gpu_id @ 32, alloc_flags @ 36, dmabuf_fd @ 40);
// The ioctls a process uses.
layout!(kfd_ioctl_runtime_enable_args, 16, r_debug @ 0, mode_mask @ 8, capabilities_mask @ 12);
layout!(kfd_ioctl_dbg_trap_args, 32, pid @ 0, op @ 4, args @ 8);
layout!(sys::kfd_ioctl_get_version_args, 8, major_version @ 0, minor_version @ 4);
layout!(sys::kfd_ioctl_acquire_vm_args, 8, drm_fd @ 0, gpu_id @ 4);
layout!(sys::kfd_ioctl_alloc_memory_of_gpu_args, 40, va_addr @ 0, size @ 8, handle @ 16,
    mmap_offset @ 24, gpu_id @ 32, flags @ 36);
layout!(sys::kfd_ioctl_free_memory_of_gpu_args, 8, handle @ 0);
layout!(sys::kfd_ioctl_map_memory_to_gpu_args, 24, handle @ 0, device_ids_array_ptr @ 8,
    n_devices @ 16, n_success @ 20);
layout!(sys::kfd_ioctl_import_dmabuf_args, 24, va_addr @ 0, handle @ 8, gpu_id @ 16,
    dmabuf_fd @ 20);
layout!(sys::kfd_ioctl_unmap_memory_from_gpu_args, 24, handle @ 0, device_ids_array_ptr @ 8,
    n_devices @ 16, n_success @ 20);
layout!(sys::kfd_ioctl_create_queue_args, 88, ring_base_address @ 0, write_pointer_address @ 8,
    read_pointer_address @ 16, doorbell_offset @ 24, ring_size @ 32, gpu_id @ 36, queue_type @ 40,
    queue_percentage @ 44, queue_priority @ 48, queue_id @ 52, eop_buffer_address @ 56,
    eop_buffer_size @ 64, ctx_save_restore_address @ 72, ctx_save_restore_size @ 80,
    ctl_stack_size @ 84);
layout!(sys::kfd_ioctl_create_event_args, 32, event_page_offset @ 0, event_trigger_data @ 8,
    event_type @ 12, auto_reset @ 16, node_id @ 20, event_id @ 24, event_slot_index @ 28);
layout!(sys::kfd_ioctl_wait_events_args, 24, events_ptr @ 0, num_events @ 8, wait_for_all @ 12,
    timeout @ 16, wait_result @ 20);
layout!(sys::kfd_ioctl_get_process_apertures_new_args, 16, kfd_process_device_apertures_ptr @ 0,
    num_of_nodes @ 8);
layout!(sys::kfd_ioctl_get_available_memory_args, 16, available @ 0, gpu_id @ 8);
layout!(kfd_ioctl_export_dmabuf_args, 16, handle @ 0, flags @ 8, dmabuf_fd @ 12);
// The render-node ioctls (sizes are also pinned by the request numbers; the offsets of
// the structs whose fields are filled one by one are pinned here).
layout!(sys::drm_version, 64, version_major @ 0, name_len @ 16, name @ 24, date_len @ 32,
    desc_len @ 48);
layout!(sys::drm_client, 40, idx @ 0, auth @ 4, pid @ 8, uid @ 16, magic @ 24, iocs @ 32);
layout!(sys::drm_gem_close, 8, handle @ 0);
layout!(sys::drm_prime_handle, 12, handle @ 0, flags @ 4, fd @ 8);
layout!(sys::drm_amdgpu_gem_create_in, 32, bo_size @ 0, alignment @ 8, domains @ 16,
    domain_flags @ 24);
layout!(sys::drm_amdgpu_gem_userptr, 24, addr @ 0, size @ 8, flags @ 16, handle @ 20);
layout!(sys::drm_amdgpu_gem_va, 40, handle @ 0, operation @ 8, flags @ 12, va_address @ 16,
    offset_in_bo @ 24, map_size @ 32);
layout!(sys::drm_amdgpu_ctx_in, 16, op @ 0, flags @ 4, ctx_id @ 8, priority @ 12);
layout!(sys::drm_amdgpu_bo_list_in, 24, operation @ 0, list_handle @ 4, bo_number @ 8,
    bo_info_size @ 12, bo_info_ptr @ 16);
layout!(sys::drm_amdgpu_bo_list_entry, 8, bo_handle @ 0, bo_priority @ 4);
layout!(sys::drm_amdgpu_cs_in, 24, ctx_id @ 0, bo_list_handle @ 4, num_chunks @ 8, flags @ 12,
    chunks @ 16);
layout!(sys::drm_amdgpu_cs_chunk, 16, chunk_id @ 0, length_dw @ 4, chunk_data @ 8);
layout!(sys::drm_amdgpu_wait_cs_in, 32, handle @ 0, timeout @ 8, ip_type @ 16, ip_instance @ 20,
    ring @ 24, ctx_id @ 28);
layout!(sys::drm_amdgpu_info, 32, return_pointer @ 0, return_size @ 8, query @ 12);
// Linux 6.18's GEM additions.
layout!(gem618::drm_gem_change_handle, 8, handle @ 0, new_handle @ 4);
layout!(gem618::drm_amdgpu_gem_op, 24, handle @ 0, op @ 4, value @ 8, num_entries @ 16,
    padding @ 20);
layout!(gem618::drm_amdgpu_gem_vm_entry, 32, addr @ 0, size @ 8, offset @ 16, flags @ 24);
layout!(gem618::drm_amdgpu_gem_list_handles, 16, entries @ 0, num_entries @ 8, padding @ 12);
layout!(gem618::drm_amdgpu_gem_list_handles_entry, 40, gem_handle @ 0, flags @ 4, size @ 8,
    preferred_domains @ 16, alloc_flags @ 24, alignment @ 32);
layout!(sys::drm_amdgpu_gem_metadata, 288, handle @ 0, op @ 4, data @ 8);
// The private-data blob.
layout!(kfd_criu_process_priv_data, 8, version @ 0, xnack_mode @ 4);
layout!(kfd_criu_device_priv_data, 8);
layout!(kfd_criu_bo_priv_data16, 80, user_addr @ 0, idr_handle @ 8, mapped_gpuids @ 12);
layout!(kfd_criu_bo_priv_data64, 272, user_addr @ 0, idr_handle @ 8, mapped_gpuids @ 12);
layout!(kfd_criu_queue_priv_data, 120, object_type @ 0, q_address @ 8, q_size @ 16,
    read_ptr_addr @ 24, write_ptr_addr @ 32, doorbell_off @ 40, eop_ring_buffer_address @ 48,
    ctx_save_restore_area_address @ 56, gpu_id @ 64, type_ @ 68, format @ 72, q_id @ 76,
    priority @ 80, q_percent @ 84, doorbell_id @ 88, gws @ 92, sdma_id @ 96,
    eop_ring_buffer_size @ 100, ctx_save_restore_area_size @ 104, ctl_stack_size @ 108,
    mqd_size @ 112);
layout!(kfd_criu_event_priv_data, 64, object_type @ 0, user_handle @ 8, event_id @ 16,
    auto_reset @ 20, type_ @ 24, signaled @ 28, exception_data @ 32);
layout!(kfd_criu_svm_range_priv_data, 24, object_type @ 0, start_addr @ 8, size @ 16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kfd_mmap_encoding() {
        let off = kfd_mmap::TYPE_DOORBELL | kfd_mmap::gpu_id(0x1a2b) | 0x1000;
        assert_eq!(off & kfd_mmap::TYPE_MASK, kfd_mmap::TYPE_DOORBELL);
        assert_eq!(kfd_mmap::get_gpu_id(off), 0x1a2b);
        assert_eq!(off & ((1 << kfd_mmap::GPU_ID_SHIFT) - 1), 0x1000);
    }

    #[test]
    fn header_constants_are_the_kernels() {
        assert_eq!(sys::KFD_IOC_ALLOC_MEM_FLAGS_VRAM, 1);
        assert_eq!(sys::KFD_IOC_ALLOC_MEM_FLAGS_USERPTR, 1 << 2);
        assert_eq!(sys::KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE, 1 << 31);
        assert_eq!(sys::KFD_IOCTL_MAJOR_VERSION, 1);
    }
}
