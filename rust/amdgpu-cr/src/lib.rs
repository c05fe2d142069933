//! amdgpu-cr: the GPU checkpoint/restore logic of criu-rocm.
//!
//! This crate is policy without a C boundary: the `criu-gpu` static library
//! translates CRIU's hook calls into calls of this crate.  Pieces:
//!
//! * [`image`] and [`proto`]: the image files (names, framing, messages,
//!   validation) — wire compatible with CRIU 4.1.1's amdgpu plugin;
//! * [`topology`]: the KFD sysfs topology model and parser, and its
//!   conversion to and from image device entries;
//! * [`matcher`]: user gpu_id → host gpu_id mapping at restore;
//! * [`env`]: the environment knobs;
//! * [`copy`]: BO content copy engines (CPU mapping, SDMA) and the per-GPU
//!   parallel workers;
//! * [`plan`]: dump and restore plans, the VMA fix-up table, device
//!   recognition.

pub mod bo;
pub mod copy;
pub mod env;
pub mod ids;
pub mod image;
pub mod matcher;
pub mod plan;
pub mod proto;
pub mod topology;
