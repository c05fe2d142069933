//! Newtypes for the id spaces the core handles, so a user gpu_id cannot be
//! passed where a GPU VA or an mmap offset is expected.
//!
//! GPU VAs, mmap offsets and render minors are the ABI crate's types.  The
//! gpu_id keeps a core type whose `Display` is hexadecimal (`0x1a2b`), the
//! way CRIU's logs, the pages file names and users quote gpu_ids; it
//! converts to and from `kfd_abi::ids::GpuId` (decimal, as in sysfs).

use std::fmt;

pub use kfd_abi::ids::{GpuVa, MmapOffset, RenderMinor};

/// A KFD gpu_id (16-bit hash shown in sysfs, carried in a u32).  Whether it
/// is a *user* id (what the application saw first) or an *actual* id (the GPU
/// it runs on now) is given by context; maps between the two are explicit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct GpuId(pub u32);

impl From<kfd_abi::ids::GpuId> for GpuId {
    fn from(g: kfd_abi::ids::GpuId) -> Self {
        GpuId(g.0)
    }
}

impl From<GpuId> for kfd_abi::ids::GpuId {
    fn from(g: GpuId) -> Self {
        kfd_abi::ids::GpuId(g.0)
    }
}

impl fmt::Display for GpuId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#06x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_id_converts_and_prints_hex() {
        let abi: kfd_abi::ids::GpuId = GpuId(0x1a2b).into();
        assert_eq!(abi.0, 0x1a2b);
        assert_eq!(GpuId::from(abi).to_string(), "0x1a2b");
    }
}
