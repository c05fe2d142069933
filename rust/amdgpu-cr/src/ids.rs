//! The id spaces the core handles, so a user gpu_id cannot be passed where a
//! GPU VA or an mmap offset is expected.
//!
//! They are the ABI crate's types, re-exported: one vocabulary from the ioctl
//! layer up.  A gpu_id prints hexadecimal (`0x1a2b`), the way CRIU's logs, the
//! pages file names and users quote gpu_ids.  Whether it is a *user* id (what
//! the application saw first) or an *actual* id (the GPU it runs on now) is
//! given by context; maps between the two are explicit.

pub use kfd_abi::ids::{GpuId, GpuVa, MmapOffset, RenderMinor};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_id_prints_hex() {
        assert_eq!(GpuId(0x1a2b).to_string(), "0x1a2b");
        assert_eq!(GpuId(0x12).to_string(), "0x0012");
    }
}
