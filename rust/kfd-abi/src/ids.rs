//! Newtypes for the id and address spaces of the KFD interface, so that a gpu_id cannot be
//! passed where a render minor is expected, or a CPU address where a GPU one is.

use core::fmt;

macro_rules! newtype {
    ($(#[$doc:meta])* $name:ident($inner:ty), $fmt:literal) => {
        $(#[$doc])*
        #[derive(Debug, Default, Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[repr(transparent)]
        pub struct $name(pub $inner);

        impl $name {
            /// The raw value.
            pub const fn get(self) -> $inner {
                self.0
            }
        }

        impl From<$inner> for $name {
            fn from(v: $inner) -> Self {
                Self(v)
            }
        }

        impl From<$name> for $inner {
            fn from(v: $name) -> Self {
                v.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, $fmt, self.0)
            }
        }
    };
}

newtype!(
    /// A KFD gpu_id (the topology node's hash id, a 16-bit value carried in a u32; decimal in
    /// sysfs). After a CRIU restore the process addresses GPUs by *user* gpu_id, which may
    /// differ from the actual one. `Display` is hexadecimal (`0x1a2b`), the way CRIU's logs,
    /// the pages file names and users quote gpu_ids; print `get()` for sysfs's decimal form.
    GpuId(u32),
    "{:#06x}"
);
newtype!(
    /// A GPU virtual address.
    GpuVa(u64),
    "{:#x}"
);
newtype!(
    /// A CPU virtual address.
    CpuVa(u64),
    "{:#x}"
);
newtype!(
    /// A byte offset to pass to `mmap` on /dev/kfd or a render node.
    MmapOffset(u64),
    "{:#x}"
);
newtype!(
    /// A KFD memory handle: `(gpu_id << 32) | idr_id`.
    BoHandle(u64),
    "{:#x}"
);
newtype!(
    /// A DRM render minor (`renderD<minor>`, usually 128 and up).
    RenderMinor(u32),
    "{}"
);
newtype!(
    /// A KFD queue id.
    QueueId(u32),
    "{}"
);
newtype!(
    /// A KFD event id.
    EventId(u32),
    "{}"
);
newtype!(
    /// A GEM handle on one DRM file.
    GemHandle(u32),
    "{}"
);

impl BoHandle {
    /// Composes a handle as the kernel does.
    pub const fn new(gpu_id: GpuId, idr: u32) -> Self {
        Self(((gpu_id.0 as u64) << 32) | idr as u64)
    }

    /// The gpu_id half.
    pub const fn gpu_id(self) -> GpuId {
        GpuId((self.0 >> 32) as u32)
    }

    /// The per-device IDR id half.
    pub const fn idr(self) -> u32 {
        self.0 as u32
    }
}

impl GpuVa {
    /// The CPU address at which the thunk maps this BO (CPU VA == GPU VA).
    pub const fn as_cpu(self) -> CpuVa {
        CpuVa(self.0)
    }
}

impl RenderMinor {
    /// `/dev/dri/renderD<minor>`.
    pub fn path(self) -> String {
        format!("/dev/dri/renderD{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bo_handle_halves() {
        let h = BoHandle::new(GpuId(0xabcd), 7);
        assert_eq!(h.get(), 0xabcd_0000_0007);
        assert_eq!(h.gpu_id(), GpuId(0xabcd));
        assert_eq!(h.idr(), 7);
        assert_eq!(BoHandle(u64::MAX).gpu_id(), GpuId(u32::MAX));
    }

    #[test]
    fn display() {
        assert_eq!(GpuId(56234).to_string(), "0xdbaa");
        assert_eq!(GpuId(0x3f2c).to_string(), "0x3f2c");
        assert_eq!(GpuId(0x12).to_string(), "0x0012");
        assert_eq!(GpuVa(0x7f00_0000_0000).to_string(), "0x7f0000000000");
        assert_eq!(MmapOffset(0).to_string(), "0x0");
        assert_eq!(BoHandle::new(GpuId(1), 2).to_string(), "0x100000002");
        assert_eq!(RenderMinor(128).path(), "/dev/dri/renderD128");
        assert_eq!(CpuVa::from(5u64), GpuVa(5).as_cpu());
        assert_eq!(u32::from(QueueId(3)), 3);
        assert_eq!(EventId(9).to_string(), "9");
    }
}
