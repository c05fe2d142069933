//! The SDMA engine's device on real hardware: a render node driven through
//! the ABI crate's amdgpu ioctls (PRIME import, userptr, GEM_VA, CTX, CS,
//! WAIT_CS).  The node is a file the session opened for the copies, so the
//! engine's mappings live in a GPU VM of its own, never the task's.  The
//! ABI layer restarts each of these ioctls on EINTR/EAGAIN (libdrm's
//! `drmIoctl` does the same), WAIT_CS with its one absolute deadline.
//!
//! [`sdma_for`] is reached when KFD exported dmabufs: on hardware, and on
//! kfd-emu under `kfd-emu supervise` (`make test-sdma`), whose render nodes
//! model these ioctls.  This file is the thin mapping of the engine's calls
//! onto ioctls.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::time::Duration;

use kfd_abi::handle::RenderNode;
use kfd_abi::ids::{CpuVa, GpuVa};
use kfd_abi::sys;

use super::sdma::{GemHandle, SdmaDevice, SdmaEngine, SdmaGen, VaWindow, AMDGPU_HW_IP_DMA};
use super::{CopyError, GpuEngine};
use crate::ids::GpuId;

fn os(e: kfd_abi::handle::Error) -> io::Error {
    io::Error::from_raw_os_error(e.errno())
}

/// A render node as an [`SdmaDevice`].
pub struct DrmSdma {
    node: RenderNode<OwnedFd>,
    gen: SdmaGen,
}

impl DrmSdma {
    /// Wraps a render-node fd (its VM is where the engine maps buffers),
    /// or says why its DMA ring cannot take our IBs: no DMA IP amdgpu has
    /// an SDMA driver for, or no ring that accepts user submissions
    /// (`amdgpu_hw_ip_info` leaves out rings that are not ready or are
    /// `no_user_submission`, e.g. SDMA 7.1 by default or SDMA 6/7 with
    /// `amdgpu.disable_kq=1`).
    pub fn new(fd: OwnedFd) -> Result<(Self, kfd_abi::handle::DevInfo), String> {
        let node = RenderNode::from_fd(fd);
        let info = node
            .amdgpu_info_dev_info()
            .map_err(|e| format!("AMDGPU_INFO_DEV_INFO: {e}"))?;
        let dma = node
            .amdgpu_info_hw_ip(AMDGPU_HW_IP_DMA)
            .map_err(|e| format!("AMDGPU_INFO_HW_IP_INFO(DMA): {e}"))?;
        let gen = SdmaGen::of_ip_version(dma.version_major).ok_or_else(|| {
            format!(
                "DMA IP {}.{} is not an SDMA generation this engine knows",
                dma.version_major, dma.version_minor
            )
        })?;
        if dma.available_rings == 0 {
            return Err(format!(
                "no DMA ring accepts user submissions (AMDGPU_INFO_HW_IP_INFO(DMA): SDMA {}.{}, \
                 available_rings 0)",
                dma.version_major, dma.version_minor
            ));
        }
        Ok((DrmSdma { node, gen }, info))
    }
}

/// CLOCK_MONOTONIC now + `d`, in ns: amdgpu's WAIT_CS takes an absolute
/// deadline.
fn deadline(d: Duration) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
        .saturating_add(d.as_nanos().min(u64::MAX as u128) as u64)
}

impl SdmaDevice for DrmSdma {
    fn generation(&self) -> SdmaGen {
        self.gen
    }

    fn import_dmabuf(&mut self, dmabuf: BorrowedFd<'_>) -> io::Result<GemHandle> {
        self.node
            .prime_fd_to_handle(dmabuf)
            .map(GemHandle)
            .map_err(os)
    }

    unsafe fn userptr(&mut self, addr: NonNull<u8>, size: u64) -> io::Result<GemHandle> {
        let flags = sys::AMDGPU_GEM_USERPTR_ANONONLY
            | sys::AMDGPU_GEM_USERPTR_VALIDATE
            | sys::AMDGPU_GEM_USERPTR_REGISTER;
        // SAFETY: this function's own contract (SdmaDevice::userptr) is gem_userptr's: the
        // caller keeps `[addr, addr + size)` mapped and reserved for the GPU until it
        // closes the handle.
        unsafe {
            self.node
                .gem_userptr(CpuVa(addr.as_ptr() as u64), size, flags)
        }
        .map(GemHandle)
        .map_err(os)
    }

    fn va_map(
        &mut self,
        handle: GemHandle,
        va: u64,
        size: u64,
        executable: bool,
    ) -> io::Result<()> {
        let mut flags = sys::AMDGPU_VM_PAGE_READABLE | sys::AMDGPU_VM_PAGE_WRITEABLE;
        if executable {
            flags |= sys::AMDGPU_VM_PAGE_EXECUTABLE;
        }
        self.node
            .gem_va(
                handle.get(),
                sys::AMDGPU_VA_OP_MAP,
                flags,
                GpuVa(va),
                0,
                size,
            )
            .map_err(os)
    }

    fn va_unmap(&mut self, handle: GemHandle, va: u64, size: u64) -> io::Result<()> {
        self.node
            .gem_va(handle.get(), sys::AMDGPU_VA_OP_UNMAP, 0, GpuVa(va), 0, size)
            .map_err(os)
    }

    fn ctx_create(&mut self) -> io::Result<u32> {
        self.node.ctx_alloc(0).map_err(os)
    }

    fn ctx_free(&mut self, ctx: u32) -> io::Result<()> {
        self.node.ctx_free(ctx).map_err(os)
    }

    fn submit(&mut self, ctx: u32, ib_va: u64, dwords: u32, bos: &[GemHandle]) -> io::Result<u64> {
        let entries: Vec<sys::drm_amdgpu_bo_list_entry> = bos
            .iter()
            .map(|&bo| sys::drm_amdgpu_bo_list_entry {
                bo_handle: bo.get(),
                bo_priority: 0,
            })
            .collect();
        let list = self.node.bo_list_create(&entries).map_err(os)?;
        let ib = sys::drm_amdgpu_cs_chunk_ib {
            va_start: ib_va,
            ib_bytes: dwords * 4,
            ip_type: AMDGPU_HW_IP_DMA,
            ..Default::default()
        };
        let chunk = sys::drm_amdgpu_cs_chunk {
            chunk_id: sys::AMDGPU_CHUNK_ID_IB,
            length_dw: (std::mem::size_of_val(&ib) / 4) as u32,
            chunk_data: &ib as *const _ as u64,
        };
        // SAFETY: the one chunk points at `ib`, a local that outlives the call and holds
        // exactly `length_dw` dwords.
        let seq = unsafe { self.node.cs_submit(ctx, list, &[chunk]) }.map_err(os);
        let destroyed = self.node.bo_list_destroy(list).map_err(os);
        let seq = seq?;
        destroyed?;
        Ok(seq)
    }

    fn wait(&mut self, ctx: u32, seq: u64, timeout: Duration) -> io::Result<bool> {
        self.node
            .wait_cs(ctx, AMDGPU_HW_IP_DMA, 0, 0, seq, deadline(timeout))
            .map_err(os)
    }

    fn gem_close(&mut self, handle: GemHandle) -> io::Result<()> {
        self.node.gem_close(handle.get()).map_err(os)
    }
}

/// An SDMA engine on the render node `fd` (a file the caller opened for
/// the copies: its VM is the engine's alone) for GPU `gpu`, placing its
/// buffers in a VA window clear of `busy`, probed with one NOP IB; or why
/// there is none.
pub fn sdma_for<'a>(
    fd: BorrowedFd<'_>,
    gpu: GpuId,
    staging: u64,
    largest_bo: u64,
    busy: &[(u64, u64)],
) -> Result<Box<dyn GpuEngine + 'a>, CopyError> {
    let setup = |what: String| CopyError::Setup { gpu, what };
    let own = fd
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| setup(format!("dup of the render node: {e}")))?;
    let (dev, info) = DrmSdma::new(own).map_err(setup)?;
    let va = VaWindow::pick(
        info.virtual_address_offset,
        info.virtual_address_max,
        busy,
        staging,
        dev.generation(),
        largest_bo,
    )
    .ok_or_else(|| setup("no free GPU VA window for the SDMA staging buffers".into()))?;
    Ok(Box::new(SdmaEngine::new(
        dev, gpu, staging, largest_bo, va,
    )?))
}
