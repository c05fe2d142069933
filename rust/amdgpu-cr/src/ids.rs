//! Newtypes for the id spaces the core handles, so a user gpu_id cannot be
//! passed where a GPU VA or an mmap offset is expected.
//!
//! These mirror the newtypes of the ABI crate; once `kfd-abi` exports them
//! this module re-exports those instead.

use std::fmt;

/// A KFD gpu_id (16-bit hash shown in sysfs, carried in a u32).  Whether it
/// is a *user* id (what the application saw first) or an *actual* id (the GPU
/// it runs on now) is given by context; maps between the two are explicit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct GpuId(pub u32);

/// A GPU virtual address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct GpuVa(pub u64);

/// A byte offset to pass to `mmap` on a device fd.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MmapOffset(pub u64);

/// The minor number of a DRM render node (`/dev/dri/renderD<minor>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct RenderMinor(pub u32);

impl fmt::Display for GpuId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#06x}", self.0)
    }
}

impl fmt::Display for GpuVa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

impl fmt::Display for MmapOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

impl fmt::Display for RenderMinor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "renderD{}", self.0)
    }
}
