//! A small libhsakmt-like client of /dev/kfd, for test programs and tools.
//!
//! It does what the ROCm thunk does before an application can touch GPU memory: open
//! /dev/kfd, find the GPUs in the sysfs topology, open each GPU's render node and make KFD
//! use its VM (ACQUIRE_VM; a GPU whose render node cannot be opened, ENOENT or EPERM, as
//! in a container given only some of the host's GPUs, is left out as the thunk leaves it), then allocate VRAM/GTT BOs that are mapped on the GPU and in
//! the process at the same address (CPU VA == GPU VA). Every mmap offset used is the one
//! the kernel returned, so the same code works on a real KFD and under kfd-emu. As the thunk,
//! it also keeps a doorbell BO (from the first queue on) and an MMIO remap BO per GPU.

mod client;
mod error;
pub mod events;
pub mod ffi;
pub mod queue;
pub mod sdma;
pub mod topology;

pub use client::{
    Bo, DeviceBo, Gpu, KfdClient, MemKind, SkippedGpu, DOORBELL_ALLOC_FLAGS, MIN_KFD_MINOR,
    MMIO_REMAP_ALLOC_FLAGS, MMIO_REMAP_SIZE,
};
pub use error::{Error, Result};
