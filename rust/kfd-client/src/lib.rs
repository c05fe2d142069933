//! A small libhsakmt-like client of /dev/kfd, for test programs and tools.
//!
//! It does what the ROCm thunk does before an application can touch GPU memory: open
//! /dev/kfd, find the GPUs in the sysfs topology, open each GPU's render node and make KFD
//! use its VM (ACQUIRE_VM), then allocate VRAM/GTT BOs that are mapped on the GPU and in
//! the process at the same address (CPU VA == GPU VA). Every mmap offset used is the one
//! the kernel returned, so the same code works on a real KFD and under kfd-emu.

mod client;
mod error;
pub mod events;
pub mod ffi;
pub mod queue;
pub mod sdma;
pub mod topology;

pub use client::{Bo, Gpu, KfdClient, MemKind, MIN_KFD_MINOR};
pub use error::{Error, Result};
