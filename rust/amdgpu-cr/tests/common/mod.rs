//! Set-up shared by the memory-bound test binaries (each its own process, so
//! that no other test disturbs the process-wide peak RSS).

#[path = "../../../test-support/scratch.rs"]
pub mod scratch;

use std::fs::File;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};

use amdgpu_cr::bo;
use amdgpu_cr::copy::{BoRef, Engines, GpuJob};
use amdgpu_cr::env::EnginePolicy;
use amdgpu_cr::ids::{GpuId, GpuVa, MmapOffset};

/// The BO's offset in the memfd standing in for a render node.
pub const BO_OFFSET: u64 = 1 << 20;

/// The process' peak RSS so far (VmHWM), in KiB.
pub fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A memfd of `len` bytes standing in for a render node (never mapped
/// here: the tests fill it with write(2)).
pub fn device(len: u64) -> File {
    // SAFETY: valid C string; memfd_create has no other preconditions.
    let fd = unsafe { libc::memfd_create(c"vram".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: fd was just created and is owned by nothing else.
    let dev = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    dev.set_len(len).unwrap();
    dev
}

/// One GPU's job: one VRAM BO of `size` bytes at [`BO_OFFSET`] of `dev`,
/// with CPU engines within `budget` bytes.
pub fn one_bo_job(dev: &File, size: u64, budget: u64) -> GpuJob<'_> {
    GpuJob {
        user: GpuId(0x1a2b),
        actual: GpuId(0x1a2b),
        bos: vec![BoRef {
            index: 0,
            gpu: GpuId(0x1a2b),
            addr: GpuVa(0x7000_0000_0000),
            size,
            alloc_flags: bo::ALLOC_VRAM,
            cpu_map: Some((dev.as_fd(), MmapOffset(BO_OFFSET))),
            dmabuf: None,
        }],
        engines: Engines::new(EnginePolicy::Auto, budget, None),
    }
}
