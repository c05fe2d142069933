//! The KFD and amdgpu kernel ABI as criu-rocm uses it.
//!
//! * [`sys`]: bindings generated from the installed uapi headers, no logic.
//! * [`ioctl`]: request numbers, checked at compile time against the kernel's values.
//! * [`criu`]: the values KFD writes into its CRIU private blob.
//! * [`exit`]: a process' exit as `/proc` shows it while it happens (KFD tears a process
//!   down once it exits).
//! * [`layout`]: the CRIU private blob and mmap offset encoding, which the headers lack,
//!   and size/offset assertions for every struct passed to the kernel.
//! * [`ids`]: newtypes for each id and address space.
//! * [`volatile`]: memory a GPU or another process may change, accessed by copies only.

#![deny(missing_docs)]

pub mod criu;
pub mod exit;
pub mod handle;
pub mod ids;
pub mod ioctl;
pub mod layout;
pub mod volatile;

/// Generated from `linux/kfd_ioctl.h`, libdrm's `drm.h` and `amdgpu_drm.h`.
pub mod sys {
    #![allow(
        non_camel_case_types,
        non_upper_case_globals,
        non_snake_case,
        dead_code
    )]
    #![allow(
        clippy::all,
        clippy::undocumented_unsafe_blocks,
        clippy::multiple_unsafe_ops_per_block
    )]
    #![allow(unsafe_op_in_unsafe_fn, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/sys.rs"));
}
