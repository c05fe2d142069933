//! Client errors: each names the GPU, BO or topology file involved and keeps the errno.

use std::path::PathBuf;

use kfd_abi::handle::Error as IoctlError;
use kfd_abi::ids::{GpuId, GpuVa, RenderMinor};

/// Why a client operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An ioctl on /dev/kfd not tied to one GPU.
    #[error("/dev/kfd: {0}")]
    Kfd(IoctlError),
    /// An ioctl or open concerning one GPU.
    #[error("GPU {} (renderD{minor}): {source}", .gpu.get())]
    Gpu {
        gpu: GpuId,
        minor: RenderMinor,
        source: IoctlError,
    },
    /// A step of allocating, mapping or freeing one BO.
    #[error("GPU {}, BO at {va} ({size} bytes): {step}: {source}", .gpu.get())]
    Bo {
        gpu: GpuId,
        va: GpuVa,
        size: u64,
        step: &'static str,
        source: IoctlError,
    },
    /// A topology file that cannot be read.
    #[error("{}: {source}", path.display())]
    TopologyIo {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A topology file with unexpected contents.
    #[error("{}: {msg}", path.display())]
    Topology { path: PathBuf, msg: String },
    /// The KFD is older than this client supports.
    #[error(
        "/dev/kfd: KFD ioctl interface {major}.{minor} is too old (need 1.{min_minor} or newer)"
    )]
    Version {
        major: u32,
        minor: u32,
        min_minor: u32,
    },
    /// A gpu_id that is not one of this client's GPUs.
    #[error("no GPU with gpu_id {} in the KFD topology", .0.get())]
    UnknownGpu(GpuId),
    /// The topology lists no GPU.
    #[error("{}: no GPU node (every gpu_id is 0)", path.display())]
    NoGpu { path: PathBuf },
    /// Every GPU of the topology was skipped: none of their render nodes can be opened.
    #[error("{}: none of the topology's {skipped} GPUs has a render node this process can open (ENOENT or EPERM on each /dev/dri/renderD*)", path.display())]
    NoUsableGpu { path: PathBuf, skipped: usize },
    /// A CPU address reservation the GPU VM cannot use.
    #[error("GPU {}: CPU reservation {va} (+{size}) is outside the GPUVM aperture {base:#x}..={limit:#x}", .gpu.get())]
    Aperture {
        gpu: GpuId,
        va: GpuVa,
        size: u64,
        base: u64,
        limit: u64,
    },
    /// A zero or overflowing allocation size.
    #[error("GPU {}: invalid BO size {size}", .gpu.get())]
    BadSize { gpu: GpuId, size: u64 },
}

impl Error {
    /// The kernel's errno, when the failure came from a syscall.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Kfd(e) | Error::Gpu { source: e, .. } | Error::Bo { source: e, .. } => {
                Some(e.errno())
            }
            Error::TopologyIo { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// Result of the client.
pub type Result<T> = std::result::Result<T, Error>;
