//! ioctl request numbers.
//!
//! bindgen cannot evaluate the header's `_IOWR()` macros, so the numbers are computed here
//! from the generated structs' sizes with the kernel's `_IOC` encoding, and pinned at
//! compile time to the values the kernel uses (an ABI drift in the header fails the build).

use crate::sys;
use core::mem::size_of;

const IOC_NRBITS: u32 = 8;
const IOC_TYPEBITS: u32 = 8;
const IOC_SIZEBITS: u32 = 14;
const IOC_NRSHIFT: u32 = 0;
const IOC_TYPESHIFT: u32 = IOC_NRSHIFT + IOC_NRBITS;
const IOC_SIZESHIFT: u32 = IOC_TYPESHIFT + IOC_TYPEBITS;
const IOC_DIRSHIFT: u32 = IOC_SIZESHIFT + IOC_SIZEBITS;
const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

/// The kernel's `_IOC(dir, type, nr, size)`.
pub const fn ioc(dir: u32, ty: u8, nr: u8, size: usize) -> u32 {
    assert!(size < (1 << IOC_SIZEBITS));
    (dir << IOC_DIRSHIFT)
        | ((ty as u32) << IOC_TYPESHIFT)
        | ((nr as u32) << IOC_NRSHIFT)
        | ((size as u32) << IOC_SIZESHIFT)
}

/// `_IOR(ty, nr, T)`.
pub const fn ior<T>(ty: u8, nr: u8) -> u32 {
    ioc(IOC_READ, ty, nr, size_of::<T>())
}
/// `_IOW(ty, nr, T)`.
pub const fn iow<T>(ty: u8, nr: u8) -> u32 {
    ioc(IOC_WRITE, ty, nr, size_of::<T>())
}
/// `_IOWR(ty, nr, T)`.
pub const fn iowr<T>(ty: u8, nr: u8) -> u32 {
    ioc(IOC_READ | IOC_WRITE, ty, nr, size_of::<T>())
}

/// `_IOC_NR(cmd)`.
pub const fn nr(cmd: u32) -> u8 {
    (cmd >> IOC_NRSHIFT) as u8
}
/// `_IOC_SIZE(cmd)`.
pub const fn size(cmd: u32) -> usize {
    ((cmd >> IOC_SIZESHIFT) & ((1 << IOC_SIZEBITS) - 1)) as usize
}

/// KFD's ioctl type, `'K'`.
pub const AMDKFD_IOCTL_BASE: u8 = b'K';
/// DRM's ioctl type, `'d'`; driver ioctls start at `DRM_COMMAND_BASE`.
pub const DRM_IOCTL_BASE: u8 = b'd';
/// The first DRM request number of a driver's own ioctls.
pub const DRM_COMMAND_BASE: u8 = 0x40;

macro_rules! kfd_ioctls {
    ($($name:ident = $dir:ident($nr:literal, $ty:ty) => $value:literal;)*) => {
        $(
            #[doc = concat!("`", stringify!($name), "`: ", stringify!($value), ".")]
            pub const $name: u32 = $dir::<$ty>(AMDKFD_IOCTL_BASE, $nr);
            const _: () = assert!($name == $value, concat!(stringify!($name), " drifted"));
        )*
        /// The name of a KFD request number, for error messages.
        pub fn kfd_ioctl_name(cmd: u32) -> &'static str {
            match cmd {
                $($name => stringify!($name),)*
                _ => "AMDKFD_IOC_(unknown)",
            }
        }
    };
}

kfd_ioctls! {
    AMDKFD_IOC_GET_VERSION = ior(0x01, sys::kfd_ioctl_get_version_args) => 0x8008_4b01;
    AMDKFD_IOC_CREATE_QUEUE = iowr(0x02, sys::kfd_ioctl_create_queue_args) => 0xc058_4b02;
    AMDKFD_IOC_DESTROY_QUEUE = iowr(0x03, sys::kfd_ioctl_destroy_queue_args) => 0xc008_4b03;
    AMDKFD_IOC_UPDATE_QUEUE = iow(0x07, sys::kfd_ioctl_update_queue_args) => 0x4018_4b07;
    AMDKFD_IOC_CREATE_EVENT = iowr(0x08, sys::kfd_ioctl_create_event_args) => 0xc020_4b08;
    AMDKFD_IOC_DESTROY_EVENT = iow(0x09, sys::kfd_ioctl_destroy_event_args) => 0x4008_4b09;
    AMDKFD_IOC_SET_EVENT = iow(0x0a, sys::kfd_ioctl_set_event_args) => 0x4008_4b0a;
    AMDKFD_IOC_RESET_EVENT = iow(0x0b, sys::kfd_ioctl_reset_event_args) => 0x4008_4b0b;
    AMDKFD_IOC_WAIT_EVENTS = iowr(0x0c, sys::kfd_ioctl_wait_events_args) => 0xc018_4b0c;
    AMDKFD_IOC_GET_PROCESS_APERTURES_NEW = iowr(0x14, sys::kfd_ioctl_get_process_apertures_new_args) => 0xc010_4b14;
    AMDKFD_IOC_ACQUIRE_VM = iow(0x15, sys::kfd_ioctl_acquire_vm_args) => 0x4008_4b15;
    AMDKFD_IOC_ALLOC_MEMORY_OF_GPU = iowr(0x16, sys::kfd_ioctl_alloc_memory_of_gpu_args) => 0xc028_4b16;
    AMDKFD_IOC_FREE_MEMORY_OF_GPU = iow(0x17, sys::kfd_ioctl_free_memory_of_gpu_args) => 0x4008_4b17;
    AMDKFD_IOC_MAP_MEMORY_TO_GPU = iowr(0x18, sys::kfd_ioctl_map_memory_to_gpu_args) => 0xc018_4b18;
    AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU = iowr(0x19, sys::kfd_ioctl_unmap_memory_from_gpu_args) => 0xc018_4b19;
    AMDKFD_IOC_IMPORT_DMABUF = iowr(0x1d, sys::kfd_ioctl_import_dmabuf_args) => 0xc018_4b1d;
    AMDKFD_IOC_SET_XNACK_MODE = iowr(0x21, sys::kfd_ioctl_set_xnack_mode_args) => 0xc004_4b21;
    AMDKFD_IOC_CRIU_OP = iowr(0x22, sys::kfd_ioctl_criu_args) => 0xc038_4b22;
    AMDKFD_IOC_AVAILABLE_MEMORY = iowr(0x23, sys::kfd_ioctl_get_available_memory_args) => 0xc010_4b23;
    AMDKFD_IOC_EXPORT_DMABUF = iowr(0x24, crate::layout::kfd_ioctl_export_dmabuf_args) => 0xc010_4b24;
    AMDKFD_IOC_RUNTIME_ENABLE = iowr(0x25, crate::layout::kfd_ioctl_runtime_enable_args) => 0xc010_4b25;
    AMDKFD_IOC_DBG_TRAP = iowr(0x26, crate::layout::kfd_ioctl_dbg_trap_args) => 0xc020_4b26;
}

macro_rules! drm_ioctls {
    ($($name:ident = $dir:ident($nr:expr, $ty:ty) => $value:literal;)*) => {
        $(
            #[doc = concat!("`", stringify!($name), "`: ", stringify!($value), ".")]
            pub const $name: u32 = $dir::<$ty>(DRM_IOCTL_BASE, $nr);
            const _: () = assert!($name == $value, concat!(stringify!($name), " drifted"));
        )*
        /// The name of a DRM request number, for error messages.
        pub fn drm_ioctl_name(cmd: u32) -> &'static str {
            match cmd {
                $($name => stringify!($name),)*
                _ => "DRM_IOCTL_(unknown)",
            }
        }
    };
}

drm_ioctls! {
    DRM_IOCTL_VERSION = iowr(0x00, sys::drm_version) => 0xc040_6400;
    DRM_IOCTL_GET_CLIENT = iowr(0x05, sys::drm_client) => 0xc028_6405;
    DRM_IOCTL_GEM_CLOSE = iow(0x09, sys::drm_gem_close) => 0x4008_6409;
    DRM_IOCTL_PRIME_HANDLE_TO_FD = iowr(0x2d, sys::drm_prime_handle) => 0xc00c_642d;
    DRM_IOCTL_PRIME_FD_TO_HANDLE = iowr(0x2e, sys::drm_prime_handle) => 0xc00c_642e;
    DRM_IOCTL_AMDGPU_GEM_CREATE = iowr(DRM_COMMAND_BASE, sys::drm_amdgpu_gem_create) => 0xc020_6440;
    DRM_IOCTL_AMDGPU_GEM_MMAP = iowr(DRM_COMMAND_BASE + 0x01, sys::drm_amdgpu_gem_mmap) => 0xc008_6441;
    DRM_IOCTL_AMDGPU_CTX = iowr(DRM_COMMAND_BASE + 0x02, sys::drm_amdgpu_ctx) => 0xc010_6442;
    DRM_IOCTL_AMDGPU_BO_LIST = iowr(DRM_COMMAND_BASE + 0x03, sys::drm_amdgpu_bo_list) => 0xc018_6443;
    DRM_IOCTL_AMDGPU_CS = iowr(DRM_COMMAND_BASE + 0x04, sys::drm_amdgpu_cs) => 0xc018_6444;
    DRM_IOCTL_AMDGPU_INFO = iow(DRM_COMMAND_BASE + 0x05, sys::drm_amdgpu_info) => 0x4020_6445;
    DRM_IOCTL_AMDGPU_GEM_VA = iow(DRM_COMMAND_BASE + 0x08, sys::drm_amdgpu_gem_va) => 0x4028_6448;
    DRM_IOCTL_AMDGPU_WAIT_CS = iowr(DRM_COMMAND_BASE + 0x09, sys::drm_amdgpu_wait_cs) => 0xc020_6449;
    DRM_IOCTL_AMDGPU_GEM_USERPTR = iowr(DRM_COMMAND_BASE + 0x11, sys::drm_amdgpu_gem_userptr) => 0xc018_6451;
    DRM_IOCTL_AMDGPU_GEM_METADATA = iowr(DRM_COMMAND_BASE + 0x06, sys::drm_amdgpu_gem_metadata) => 0xc120_6446;
    DRM_IOCTL_AMDGPU_GEM_WAIT_IDLE = iowr(DRM_COMMAND_BASE + 0x07, sys::drm_amdgpu_gem_wait_idle) => 0xc010_6447;
    DRM_IOCTL_AMDGPU_GEM_OP = iowr(DRM_COMMAND_BASE + 0x10, crate::layout::gem618::drm_amdgpu_gem_op) => 0xc018_6450;
    DRM_IOCTL_AMDGPU_GEM_LIST_HANDLES = iowr(DRM_COMMAND_BASE + 0x19, crate::layout::gem618::drm_amdgpu_gem_list_handles) => 0xc010_6459;
    DRM_IOCTL_GEM_CHANGE_HANDLE = iowr(0xd2, crate::layout::gem618::drm_gem_change_handle) => 0xc008_64d2;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding_inverts_encoding() {
        assert_eq!(nr(AMDKFD_IOC_CRIU_OP), 0x22);
        assert_eq!(size(AMDKFD_IOC_CRIU_OP), 56);
        assert_eq!(size(AMDKFD_IOC_CREATE_QUEUE), 88);
        assert_eq!(
            kfd_ioctl_name(AMDKFD_IOC_ACQUIRE_VM),
            "AMDKFD_IOC_ACQUIRE_VM"
        );
        assert_eq!(kfd_ioctl_name(0x1234), "AMDKFD_IOC_(unknown)");
        assert_eq!(drm_ioctl_name(DRM_IOCTL_AMDGPU_CS), "DRM_IOCTL_AMDGPU_CS");
    }
}
