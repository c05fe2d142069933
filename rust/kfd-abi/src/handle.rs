//! The safe layer: one handle type per fd kind, one method per ioctl, all of one shape.
//!
//! Each method fills the kernel struct, issues the ioctl through `ioctl_mut` (the one
//! place that touches the raw syscall) and turns failure into an [`Error`] that keeps the
//! ioctl's name and errno.
//!
//! # Restarting after EINTR and EAGAIN
//!
//! The methods restart an ioctl the kernel answered EINTR or EAGAIN exactly where the
//! kernel expects user space to do so, as the C libraries on top of these files do:
//! libdrm's `drmIoctl` loops on both for every DRM ioctl, and libhsakmt's `kmtIoctl`
//! (`libhsakmt.c`) loops on both for every KFD ioctl.  Concretely ([`restarting`]):
//!
//! * **Every render-node ioctl** ([`RenderNode`]).  `amdgpu_cs_ioctl` answers EAGAIN when
//!   an MMU notifier invalidated a userptr BO of the submission while it was being set up
//!   (`amdgpu_cs_parser_bos` / `amdgpu_cs_submit` check `mmu_interval_read_retry`) and
//!   expects the caller to submit again; CS, GEM_VA, GEM_USERPTR and CTX take their locks
//!   and wait for fences interruptibly, so a signal without `SA_RESTART` surfaces as EINTR
//!   (`-ERESTARTSYS`); WAIT_CS (`amdgpu_cs_wait_ioctl`) takes an *absolute* CLOCK_MONOTONIC
//!   deadline, so restarting it with the same argument keeps one deadline across retries.
//! * **KFD's memory, queue and event ioctls** ([`Kfd`]): `kfd_ioctl_alloc_memory_of_gpu`,
//!   `kfd_ioctl_map_memory_to_gpu` and their peers reserve BOs and VMs interruptibly
//!   (`-ERESTARTSYS`) and a userptr BO's validation can ask for a retry (EAGAIN).
//! * **Not restarted:** KFD's `WAIT_EVENTS` (its timeout is relative: the caller restarts
//!   with what is left, see `kfd-client`'s event waits) and the CRIU ops (`CRIU_OP`):
//!   CHECKPOINT installs dmabuf fds and RESTORE creates BOs as they go, so a repeated call
//!   is not the same call; their callers see the EINTR and decide.
//!
//! EINTR is retried without bound (each one needs a new signal); EAGAIN up to
//! [`EAGAIN_RETRIES`] times, yielding the CPU in between, then reported.

use crate::ids::{BoHandle, CpuVa, EventId, GpuId, GpuVa, MmapOffset, QueueId, RenderMinor};
use crate::ioctl::*;
use crate::layout::{criu_op, gem618, kfd_ioctl_export_dmabuf_args};
use crate::sys;
use crate::volatile::VolatileSlice;
use std::ffi::CStr;
use std::fmt;
use std::fs::OpenOptions;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::ptr::NonNull;

/// A failed ioctl (or open/mmap): which one, and the errno the kernel gave.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Error {
    /// The ioctl (`AMDKFD_IOC_ALLOC_MEMORY_OF_GPU`) or syscall (`mmap`) that failed.
    pub ioctl: &'static str,
    /// The positive errno it returned.
    pub errno: i32,
}

impl Error {
    /// An error for `ioctl` with the positive `errno`.
    pub const fn new(ioctl: &'static str, errno: i32) -> Self {
        Self { ioctl, errno }
    }

    /// The positive errno.
    pub fn errno(&self) -> i32 {
        self.errno
    }

    /// Whether the call was interrupted by a signal (`EINTR`).
    pub fn is_eintr(&self) -> bool {
        self.errno == libc::EINTR
    }

    fn last(ioctl: &'static str) -> Self {
        Self {
            ioctl,
            errno: std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let msg = std::io::Error::from_raw_os_error(self.errno);
        // io::Error's Display appends " (os error N)"; say it our way.
        let text = msg.to_string();
        let text = text.split(" (os error").next().unwrap_or(&text);
        write!(f, "{}: {} (errno {})", self.ioctl, text, self.errno)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for Error {}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        std::io::Error::from_raw_os_error(e.errno)
    }
}

/// The result of every call of this module.
pub type Result<T> = std::result::Result<T, Error>;

/// How many EAGAIN answers in a row [`restarting`] retries before it reports one.  The
/// kernel answers EAGAIN while another thread keeps invalidating the pages of a userptr BO
/// (NUMA balancing, THP collapse, compaction, swap); a few retries see it through, an
/// endless stream is a real error worth reporting.
pub const EAGAIN_RETRIES: u32 = 1000;

/// Runs `call` until it returns something other than EINTR or EAGAIN (at most
/// [`EAGAIN_RETRIES`] EAGAINs in a row): the restart libdrm's `drmIoctl` and libhsakmt's
/// `kmtIoctl` do.  `call` must be idempotent: it is issued again with the same argument.
pub fn restarting<T>(mut call: impl FnMut() -> Result<T>) -> Result<T> {
    let mut eagain = 0;
    loop {
        match call() {
            Err(e) if e.errno == libc::EINTR => {}
            Err(e) if e.errno == libc::EAGAIN && eagain < EAGAIN_RETRIES => {
                eagain += 1;
                std::thread::yield_now();
            }
            r => return r,
        }
    }
}

/// Issues `cmd` on `fd` with `arg` as the in/out struct, once.
fn ioctl_mut<T>(fd: BorrowedFd<'_>, cmd: u32, name: &'static str, arg: &mut T) -> Result<i32> {
    // SAFETY: `arg` is a live, exclusively borrowed `T`, and every caller pairs `cmd` with the
    // `T` whose size is encoded in it, so the kernel reads and writes only within `*arg`.
    // Pointers nested inside `T` are set by the callers from live slices of the stated length.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), cmd as libc::c_ulong, arg as *mut T) };
    if r < 0 {
        Err(Error::last(name))
    } else {
        Ok(r)
    }
}

fn open_device(path: &str, op: &'static str) -> Result<OwnedFd> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map(OwnedFd::from)
        .map_err(|e| Error {
            ioctl: op,
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        })
}

/// Counts KFD reports after PROCESS_INFO.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Device records in the blob.
    pub num_devices: u32,
    /// BOs of the process.
    pub num_bos: u32,
    /// Queues, events and SVM ranges in the blob.
    pub num_objects: u32,
    /// Bytes of the private blob.
    pub priv_data_size: u64,
    /// The process's pid in its own pid namespace.
    pub pid: u32,
}

/// A `/dev/kfd` file descriptor: owned, or borrowed (e.g. a fd CRIU drained from a task).
#[derive(Debug)]
pub struct Kfd<F: AsFd = OwnedFd> {
    fd: F,
}

impl Kfd<OwnedFd> {
    /// Where KFD lives.
    pub const PATH: &'static str = "/dev/kfd";

    /// Opens `/dev/kfd`, which creates (or joins) this process's KFD context.
    pub fn open() -> Result<Self> {
        open_device(Self::PATH, "open(/dev/kfd)").map(|fd| Self { fd })
    }
}

impl<F: AsFd> Kfd<F> {
    /// Wraps a descriptor already known to be a KFD fd.
    pub fn from_fd(fd: F) -> Self {
        Self { fd }
    }

    /// The device fd.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Issues `cmd`, restarted on EINTR/EAGAIN as `kmtIoctl` does (see the module docs),
    /// except WAIT_EVENTS, whose relative timeout the caller must shorten first.
    fn io<T>(&self, cmd: u32, arg: &mut T) -> Result<i32> {
        let name = kfd_ioctl_name(cmd);
        if cmd == AMDKFD_IOC_WAIT_EVENTS {
            return ioctl_mut(self.fd.as_fd(), cmd, name, arg);
        }
        restarting(|| ioctl_mut(self.fd.as_fd(), cmd, name, &mut *arg))
    }

    /// (major, minor) of the KFD uapi.
    pub fn get_version(&self) -> Result<(u32, u32)> {
        let mut a = sys::kfd_ioctl_get_version_args::default();
        self.io(AMDKFD_IOC_GET_VERSION, &mut a)?;
        Ok((a.major_version, a.minor_version))
    }

    /// Apertures of every GPU the process can use (up to `max` GPUs).
    pub fn get_process_apertures_new(
        &self,
        max: usize,
    ) -> Result<Vec<sys::kfd_process_device_apertures>> {
        let mut v = vec![sys::kfd_process_device_apertures::default(); max];
        let mut a = sys::kfd_ioctl_get_process_apertures_new_args {
            kfd_process_device_apertures_ptr: v.as_mut_ptr() as u64,
            num_of_nodes: max as u32,
            ..Default::default()
        };
        self.io(AMDKFD_IOC_GET_PROCESS_APERTURES_NEW, &mut a)?;
        v.truncate(a.num_of_nodes as usize);
        Ok(v)
    }

    /// Binds the GPU's per-process VM to a render-node file of this process.
    pub fn acquire_vm(&self, gpu: GpuId, drm: BorrowedFd<'_>) -> Result<()> {
        let mut a = sys::kfd_ioctl_acquire_vm_args {
            drm_fd: drm.as_raw_fd() as u32,
            gpu_id: gpu.0,
        };
        self.io(AMDKFD_IOC_ACQUIRE_VM, &mut a).map(drop)
    }

    /// Allocates a BO at `va`. A USERPTR BO, whose pages are process memory, is refused
    /// with EINVAL before any ioctl: [`Kfd::alloc_userptr_memory_of_gpu`] makes those.
    pub fn alloc_memory_of_gpu(
        &self,
        gpu: GpuId,
        va: GpuVa,
        size: u64,
        flags: u32,
    ) -> Result<(BoHandle, MmapOffset)> {
        if flags & sys::KFD_IOC_ALLOC_MEM_FLAGS_USERPTR != 0 {
            return Err(Error::new("AMDKFD_IOC_ALLOC_MEMORY_OF_GPU", libc::EINVAL));
        }
        self.alloc(gpu, va, size, flags, 0)
    }

    /// Allocates a USERPTR BO at `va` over `size` bytes of this process' memory at `addr`
    /// (the USERPTR flag is added to `flags`).
    ///
    /// # Safety
    /// Once the BO is mapped in a GPU VM, the GPU reads and writes `[addr, addr + size)`
    /// behind the compiler's back. The caller must keep that range mapped, and not rely on
    /// its contents through Rust references, until the BO is freed or /dev/kfd is closed.
    pub unsafe fn alloc_userptr_memory_of_gpu(
        &self,
        gpu: GpuId,
        va: GpuVa,
        size: u64,
        flags: u32,
        addr: CpuVa,
    ) -> Result<(BoHandle, MmapOffset)> {
        self.alloc(
            gpu,
            va,
            size,
            flags | sys::KFD_IOC_ALLOC_MEM_FLAGS_USERPTR,
            addr.0,
        )
    }

    fn alloc(
        &self,
        gpu: GpuId,
        va: GpuVa,
        size: u64,
        flags: u32,
        mmap_offset: u64,
    ) -> Result<(BoHandle, MmapOffset)> {
        let mut a = sys::kfd_ioctl_alloc_memory_of_gpu_args {
            va_addr: va.0,
            size,
            mmap_offset,
            gpu_id: gpu.0,
            flags,
            ..Default::default()
        };
        self.io(AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, &mut a)?;
        Ok((BoHandle(a.handle), MmapOffset(a.mmap_offset)))
    }

    /// `AMDKFD_IOC_FREE_MEMORY_OF_GPU`: frees a BO.
    pub fn free_memory_of_gpu(&self, bo: BoHandle) -> Result<()> {
        let mut a = sys::kfd_ioctl_free_memory_of_gpu_args { handle: bo.0 };
        self.io(AMDKFD_IOC_FREE_MEMORY_OF_GPU, &mut a).map(drop)
    }

    /// Maps `bo` into the GPU VMs of `gpus`; returns how many succeeded.
    pub fn map_memory_to_gpu(&self, bo: BoHandle, gpus: &[GpuId]) -> Result<u32> {
        let ids: Vec<u32> = gpus.iter().map(|g| g.0).collect();
        let mut a = sys::kfd_ioctl_map_memory_to_gpu_args {
            handle: bo.0,
            device_ids_array_ptr: ids.as_ptr() as u64,
            n_devices: ids.len() as u32,
            n_success: 0,
        };
        self.io(AMDKFD_IOC_MAP_MEMORY_TO_GPU, &mut a)?;
        Ok(a.n_success)
    }

    /// `AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU`: unmaps a BO from `gpus`; returns how many were processed.
    pub fn unmap_memory_from_gpu(&self, bo: BoHandle, gpus: &[GpuId]) -> Result<u32> {
        let ids: Vec<u32> = gpus.iter().map(|g| g.0).collect();
        let mut a = sys::kfd_ioctl_unmap_memory_from_gpu_args {
            handle: bo.0,
            device_ids_array_ptr: ids.as_ptr() as u64,
            n_devices: ids.len() as u32,
            n_success: 0,
        };
        self.io(AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU, &mut a)?;
        Ok(a.n_success)
    }

    /// Creates a user-mode queue; KFD fills the queue id and doorbell offset in `args`.
    ///
    /// # Safety
    /// From this call on, the GPU reads the ring at `ring_base_address` and reads and writes
    /// the pointers at `read_pointer_address`, `write_pointer_address` (and the EOP and
    /// context save areas when given) behind the compiler's back. The caller must keep that
    /// memory mapped and reserved for the queue until `destroy_queue` or /dev/kfd is closed.
    pub unsafe fn create_queue(
        &self,
        args: &mut sys::kfd_ioctl_create_queue_args,
    ) -> Result<QueueId> {
        self.io(AMDKFD_IOC_CREATE_QUEUE, args)?;
        Ok(QueueId(args.queue_id))
    }

    /// `AMDKFD_IOC_DESTROY_QUEUE`.
    pub fn destroy_queue(&self, q: QueueId) -> Result<()> {
        let mut a = sys::kfd_ioctl_destroy_queue_args {
            queue_id: q.0,
            pad: 0,
        };
        self.io(AMDKFD_IOC_DESTROY_QUEUE, &mut a).map(drop)
    }

    /// `AMDKFD_IOC_UPDATE_QUEUE`.
    pub fn update_queue(&self, args: &mut sys::kfd_ioctl_update_queue_args) -> Result<()> {
        self.io(AMDKFD_IOC_UPDATE_QUEUE, args).map(drop)
    }

    /// Creates an event; KFD fills the id, slot and page offset in `args`.
    pub fn create_event(&self, args: &mut sys::kfd_ioctl_create_event_args) -> Result<EventId> {
        self.io(AMDKFD_IOC_CREATE_EVENT, args)?;
        Ok(EventId(args.event_id))
    }

    /// `AMDKFD_IOC_DESTROY_EVENT`.
    pub fn destroy_event(&self, e: EventId) -> Result<()> {
        let mut a = sys::kfd_ioctl_destroy_event_args {
            event_id: e.0,
            pad: 0,
        };
        self.io(AMDKFD_IOC_DESTROY_EVENT, &mut a).map(drop)
    }

    /// `AMDKFD_IOC_SET_EVENT`: signals an event.
    pub fn set_event(&self, e: EventId) -> Result<()> {
        let mut a = sys::kfd_ioctl_set_event_args {
            event_id: e.0,
            pad: 0,
        };
        self.io(AMDKFD_IOC_SET_EVENT, &mut a).map(drop)
    }

    /// `AMDKFD_IOC_RESET_EVENT`.
    pub fn reset_event(&self, e: EventId) -> Result<()> {
        let mut a = sys::kfd_ioctl_reset_event_args {
            event_id: e.0,
            pad: 0,
        };
        self.io(AMDKFD_IOC_RESET_EVENT, &mut a).map(drop)
    }

    /// Waits for `events` (all or any) up to `timeout_ms`; returns KFD's wait result
    /// (`KFD_IOC_WAIT_RESULT_*`). An interrupted wait is an EINTR error.
    pub fn wait_events(
        &self,
        events: &mut [sys::kfd_event_data],
        wait_for_all: bool,
        timeout_ms: u32,
    ) -> Result<u32> {
        let mut a = sys::kfd_ioctl_wait_events_args {
            events_ptr: events.as_mut_ptr() as u64,
            num_events: events.len() as u32,
            wait_for_all: wait_for_all as u32,
            timeout: timeout_ms,
            wait_result: 0,
        };
        self.io(AMDKFD_IOC_WAIT_EVENTS, &mut a)?;
        Ok(a.wait_result)
    }

    /// `AMDKFD_IOC_AVAILABLE_MEMORY`: bytes of VRAM this process may still allocate on `gpu`.
    pub fn available_memory(&self, gpu: GpuId) -> Result<u64> {
        let mut a = sys::kfd_ioctl_get_available_memory_args {
            gpu_id: gpu.0,
            ..Default::default()
        };
        self.io(AMDKFD_IOC_AVAILABLE_MEMORY, &mut a)?;
        Ok(a.available)
    }

    /// `AMDKFD_IOC_SET_XNACK_MODE`: sets XNACK (`mode` 0 or 1) or, with -1, reads it; returns the mode.
    pub fn set_xnack_mode(&self, mode: i32) -> Result<i32> {
        let mut a = sys::kfd_ioctl_set_xnack_mode_args {
            xnack_enabled: mode,
        };
        self.io(AMDKFD_IOC_SET_XNACK_MODE, &mut a)?;
        Ok(a.xnack_enabled)
    }

    /// `AMDKFD_IOC_IMPORT_DMABUF`: a BO of the process on `gpu` at GPU VA
    /// `va` whose memory is the dma-buf's BO; returns its handle.
    pub fn import_dmabuf(&self, gpu: GpuId, va: u64, dmabuf: BorrowedFd<'_>) -> Result<BoHandle> {
        let mut a = sys::kfd_ioctl_import_dmabuf_args {
            va_addr: va,
            handle: 0,
            gpu_id: gpu.0,
            dmabuf_fd: dmabuf.as_raw_fd() as u32,
        };
        self.io(AMDKFD_IOC_IMPORT_DMABUF, &mut a)?;
        Ok(BoHandle(a.handle))
    }

    /// Exports a BO as a dmabuf (KFD 1.12+); returns the new fd.
    pub fn export_dmabuf(&self, bo: BoHandle, flags: u32) -> Result<OwnedFd> {
        let mut a = kfd_ioctl_export_dmabuf_args {
            handle: bo.0,
            flags,
            dmabuf_fd: 0,
        };
        self.io(AMDKFD_IOC_EXPORT_DMABUF, &mut a)?;
        // SAFETY: on success the kernel installed a new fd in our table and handed its
        // ownership to us through `dmabuf_fd`.
        Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(a.dmabuf_fd as i32) })
    }

    fn criu(&self, op: u32, a: &mut sys::kfd_ioctl_criu_args) -> Result<()> {
        a.op = op;
        ioctl_mut(self.fd.as_fd(), AMDKFD_IOC_CRIU_OP, criu_op_name(op), a).map(drop)
    }

    /// Evicts the process's queues and reports what CHECKPOINT will need.
    pub fn criu_process_info(&self) -> Result<ProcessInfo> {
        let mut a = sys::kfd_ioctl_criu_args::default();
        self.criu(criu_op::PROCESS_INFO, &mut a)?;
        Ok(ProcessInfo {
            num_devices: a.num_devices,
            num_bos: a.num_bos,
            num_objects: a.num_objects,
            priv_data_size: a.priv_data_size,
            pid: a.pid,
        })
    }

    /// Fills the three buffers, sized from [`Kfd::criu_process_info`].
    pub fn criu_checkpoint(
        &self,
        num_objects: u32,
        devices: &mut [sys::kfd_criu_device_bucket],
        bos: &mut [sys::kfd_criu_bo_bucket],
        priv_data: &mut [u8],
    ) -> Result<()> {
        let mut a = criu_buffers(num_objects, devices, bos, priv_data);
        self.criu(criu_op::CHECKPOINT, &mut a)
    }

    /// `AMDKFD_IOC_CRIU_OP(UNPAUSE)`: lets this file's paused queues run again.
    pub fn criu_unpause(&self) -> Result<()> {
        self.criu(criu_op::UNPAUSE, &mut sys::kfd_ioctl_criu_args::default())
    }

    /// Recreates the checkpointed state in the calling process; KFD fills each bucket's
    /// `restored_offset` and `dmabuf_fd`.
    pub fn criu_restore(
        &self,
        num_objects: u32,
        devices: &mut [sys::kfd_criu_device_bucket],
        bos: &mut [sys::kfd_criu_bo_bucket],
        priv_data: &mut [u8],
    ) -> Result<()> {
        let mut a = criu_buffers(num_objects, devices, bos, priv_data);
        self.criu(criu_op::RESTORE, &mut a)
    }

    /// Restarts the queues of the restored process `pid` (a pid in the caller's namespace).
    pub fn criu_resume(&self, pid: u32) -> Result<()> {
        let mut a = sys::kfd_ioctl_criu_args {
            pid,
            ..Default::default()
        };
        self.criu(criu_op::RESUME, &mut a)
    }
}

fn criu_buffers(
    num_objects: u32,
    devices: &mut [sys::kfd_criu_device_bucket],
    bos: &mut [sys::kfd_criu_bo_bucket],
    priv_data: &mut [u8],
) -> sys::kfd_ioctl_criu_args {
    sys::kfd_ioctl_criu_args {
        devices: devices.as_mut_ptr() as u64,
        bos: bos.as_mut_ptr() as u64,
        priv_data: priv_data.as_mut_ptr() as u64,
        priv_data_size: priv_data.len() as u64,
        num_devices: devices.len() as u32,
        num_bos: bos.len() as u32,
        num_objects,
        ..Default::default()
    }
}

fn criu_op_name(op: u32) -> &'static str {
    match op {
        criu_op::PROCESS_INFO => "AMDKFD_IOC_CRIU_OP(PROCESS_INFO)",
        criu_op::CHECKPOINT => "AMDKFD_IOC_CRIU_OP(CHECKPOINT)",
        criu_op::UNPAUSE => "AMDKFD_IOC_CRIU_OP(UNPAUSE)",
        criu_op::RESTORE => "AMDKFD_IOC_CRIU_OP(RESTORE)",
        criu_op::RESUME => "AMDKFD_IOC_CRIU_OP(RESUME)",
        _ => "AMDKFD_IOC_CRIU_OP(?)",
    }
}

/// The GPU facts the copy engines need from `AMDGPU_INFO_DEV_INFO`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DevInfo {
    /// `AMDGPU_FAMILY_*`.
    pub family: u32,
    /// The first usable GPU virtual address.
    pub virtual_address_offset: u64,
    /// The end of the usable GPU virtual addresses.
    pub virtual_address_max: u64,
}

/// What `AMDGPU_INFO_HW_IP_INFO` reports about one IP type of a GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HwIpInfo {
    /// The IP block's version (for `AMDGPU_HW_IP_DMA` the SDMA generation: 2 CIK, 2.4/3 VI,
    /// 4 GFX9, 5 GFX10, 6 GFX11, 7 GFX12).
    pub version_major: u32,
    /// The IP block's minor version.
    pub version_minor: u32,
    /// Alignment an IB's start needs, in bytes.
    pub ib_start_alignment: u32,
    /// Alignment an IB's size needs, in bytes.
    pub ib_size_alignment: u32,
    /// Rings that accept user submissions (`amdgpu_hw_ip_info` counts only rings whose
    /// scheduler is ready and that are not `no_user_submission`).
    pub available_rings: u32,
}

/// A `/dev/dri/renderD<minor>` file descriptor.
#[derive(Debug)]
pub struct RenderNode<F: AsFd = OwnedFd> {
    fd: F,
}

impl RenderNode<OwnedFd> {
    /// Opens `/dev/dri/renderD<minor>` read/write, close-on-exec.
    pub fn open(minor: RenderMinor) -> Result<Self> {
        open_device(&minor.path(), "open(/dev/dri/renderD*)").map(|fd| Self { fd })
    }
}

impl<F: AsFd> RenderNode<F> {
    /// Wraps an fd of a render node (owned or borrowed).
    pub fn from_fd(fd: F) -> Self {
        Self { fd }
    }

    /// The device fd.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Issues `cmd`, restarted on EINTR/EAGAIN as libdrm's `drmIoctl` does (see the module
    /// docs).
    fn io<T>(&self, cmd: u32, arg: &mut T) -> Result<i32> {
        let name = drm_ioctl_name(cmd);
        restarting(|| ioctl_mut(self.fd.as_fd(), cmd, name, &mut *arg))
    }

    /// The kernel driver's name ("amdgpu").
    pub fn drm_version(&self) -> Result<String> {
        let mut name = [0u8; 64];
        let mut a = sys::drm_version {
            name_len: name.len() as _,
            name: name.as_mut_ptr().cast(),
            ..Default::default()
        };
        self.io(DRM_IOCTL_VERSION, &mut a)?;
        let len = (a.name_len as usize).min(name.len() - 1);
        name[len] = 0;
        Ok(CStr::from_bytes_until_nul(&name)
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default())
    }

    /// `DRM_IOCTL_AMDGPU_INFO(AMDGPU_INFO_DEV_INFO)`.
    pub fn amdgpu_info_dev_info(&self) -> Result<DevInfo> {
        let mut info = sys::drm_amdgpu_info_device::default();
        let mut a = sys::drm_amdgpu_info {
            return_pointer: &mut info as *mut _ as u64,
            return_size: std::mem::size_of_val(&info) as u32,
            query: sys::AMDGPU_INFO_DEV_INFO,
            ..Default::default()
        };
        self.io(DRM_IOCTL_AMDGPU_INFO, &mut a)?;
        Ok(DevInfo {
            family: info.family,
            virtual_address_offset: info.virtual_address_offset,
            virtual_address_max: info.virtual_address_max,
        })
    }

    /// `AMDGPU_INFO_HW_IP_INFO` for IP type `ip_type` (`AMDGPU_HW_IP_*`), instance 0.
    pub fn amdgpu_info_hw_ip(&self, ip_type: u32) -> Result<HwIpInfo> {
        let mut info = sys::drm_amdgpu_info_hw_ip::default();
        let mut a = sys::drm_amdgpu_info {
            return_pointer: &mut info as *mut _ as u64,
            return_size: std::mem::size_of_val(&info) as u32,
            query: sys::AMDGPU_INFO_HW_IP_INFO,
            ..Default::default()
        };
        a.__bindgen_anon_1.query_hw_ip = sys::drm_amdgpu_info__bindgen_ty_1__bindgen_ty_2 {
            type_: ip_type,
            ip_instance: 0,
        };
        self.io(DRM_IOCTL_AMDGPU_INFO, &mut a)?;
        Ok(HwIpInfo {
            version_major: info.hw_ip_version_major,
            version_minor: info.hw_ip_version_minor,
            ib_start_alignment: info.ib_start_alignment,
            ib_size_alignment: info.ib_size_alignment,
            available_rings: info.available_rings,
        })
    }

    /// The fake mmap offset of a GEM handle on this file.
    pub fn gem_mmap(&self, handle: u32) -> Result<MmapOffset> {
        let mut a = sys::drm_amdgpu_gem_mmap::default();
        a.in_.handle = handle;
        self.io(DRM_IOCTL_AMDGPU_GEM_MMAP, &mut a)?;
        // SAFETY: after a successful GEM_MMAP the kernel wrote the `out` member of the union.
        Ok(MmapOffset(unsafe { a.out.addr_ptr }))
    }

    /// `DRM_IOCTL_GEM_CLOSE`.
    pub fn gem_close(&self, handle: u32) -> Result<()> {
        let mut a = sys::drm_gem_close { handle, pad: 0 };
        self.io(DRM_IOCTL_GEM_CLOSE, &mut a).map(drop)
    }

    /// `DRM_IOCTL_PRIME_FD_TO_HANDLE`: a GEM handle of a dma-buf.
    pub fn prime_fd_to_handle(&self, dmabuf: BorrowedFd<'_>) -> Result<u32> {
        let mut a = sys::drm_prime_handle {
            fd: dmabuf.as_raw_fd(),
            ..Default::default()
        };
        self.io(DRM_IOCTL_PRIME_FD_TO_HANDLE, &mut a)?;
        Ok(a.handle)
    }

    /// Exports a GEM handle as a dmabuf fd with fd `flags` (`DRM_CLOEXEC | DRM_RDWR`).
    pub fn prime_handle_to_fd(&self, handle: u32, flags: u32) -> Result<OwnedFd> {
        let mut a = sys::drm_prime_handle {
            handle,
            flags,
            fd: -1,
        };
        self.io(DRM_IOCTL_PRIME_HANDLE_TO_FD, &mut a)?;
        // SAFETY: on success the kernel installed a new fd in our table and handed its
        // ownership to us through `fd`.
        Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(a.fd) })
    }

    /// `DRM_IOCTL_AMDGPU_GEM_LIST_HANDLES` (Linux 6.18): every GEM handle of this file, in
    /// handle order. A kernel without it answers EINVAL (an unknown amdgpu ioctl).
    pub fn gem_list_handles(&self) -> Result<Vec<gem618::drm_amdgpu_gem_list_handles_entry>> {
        loop {
            let mut a = gem618::drm_amdgpu_gem_list_handles::default();
            self.io(DRM_IOCTL_AMDGPU_GEM_LIST_HANDLES, &mut a)?;
            if a.num_entries == 0 {
                return Ok(Vec::new());
            }
            let room = a.num_entries;
            let mut v = vec![gem618::drm_amdgpu_gem_list_handles_entry::default(); room as usize];
            a.entries = v.as_mut_ptr() as u64;
            match self.io(DRM_IOCTL_AMDGPU_GEM_LIST_HANDLES, &mut a) {
                // Handles came between the calls (or during the second): again.
                Err(e) if e.errno() == libc::EAGAIN => continue,
                Err(e) => return Err(e),
                Ok(_) if a.num_entries > room => continue,
                Ok(_) => {
                    v.truncate(a.num_entries as usize);
                    return Ok(v);
                }
            }
        }
    }

    /// `DRM_IOCTL_AMDGPU_GEM_OP(GET_MAPPING_INFO)` (Linux 6.18): the GPU VA mappings of GEM
    /// handle `handle` in this file's VM. A kernel without it answers EINVAL.
    pub fn gem_mapping_info(&self, handle: u32) -> Result<Vec<gem618::drm_amdgpu_gem_vm_entry>> {
        let mut v: Vec<gem618::drm_amdgpu_gem_vm_entry> = Vec::new();
        loop {
            let room = v.len() as u32;
            let mut a = gem618::drm_amdgpu_gem_op {
                handle,
                op: gem618::AMDGPU_GEM_OP_GET_MAPPING_INFO,
                value: v.as_mut_ptr() as u64,
                num_entries: room,
                padding: 0,
            };
            self.io(DRM_IOCTL_AMDGPU_GEM_OP, &mut a)?;
            if a.num_entries <= room {
                v.truncate(a.num_entries as usize);
                return Ok(v);
            }
            // Too little room (or mappings came meanwhile): the count needed came back.
            v = vec![gem618::drm_amdgpu_gem_vm_entry::default(); a.num_entries as usize];
        }
    }

    /// `DRM_IOCTL_GEM_CHANGE_HANDLE` (Linux 6.18.0-6.18.35): GEM handle `handle` becomes
    /// `new_handle`. Kernels before 6.18, and from 6.18.36 and 7.1 on, answer EINVAL.
    pub fn gem_change_handle(&self, handle: u32, new_handle: u32) -> Result<()> {
        let mut a = gem618::drm_gem_change_handle { handle, new_handle };
        self.io(DRM_IOCTL_GEM_CHANGE_HANDLE, &mut a).map(drop)
    }

    /// `DRM_IOCTL_AMDGPU_GEM_WAIT_IDLE` of GEM handle `handle`, waiting at most `timeout`:
    /// whether the BO is idle (no submission still uses it) by then.  The kernel takes an
    /// absolute CLOCK_MONOTONIC deadline (amdgpu_gem_timeout), as libdrm computes it.
    pub fn gem_wait_idle(&self, handle: u32, timeout: std::time::Duration) -> Result<bool> {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now` is a valid timespec for clock_gettime to write.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
        let now_ns = (now.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(now.tv_nsec as u64);
        let deadline = now_ns
            .saturating_add(timeout.as_nanos().min(u128::from(u64::MAX)) as u64)
            .min(i64::MAX as u64);
        let mut a = sys::drm_amdgpu_gem_wait_idle::default();
        a.in_ = sys::drm_amdgpu_gem_wait_idle_in {
            handle,
            flags: 0,
            timeout: deadline,
        };
        self.io(DRM_IOCTL_AMDGPU_GEM_WAIT_IDLE, &mut a)?;
        // SAFETY: after a successful WAIT_IDLE the kernel wrote the `out` member; status 0
        // is idle, 1 still busy at the deadline.
        Ok(unsafe { a.out.status } == 0)
    }

    /// Whether this file holds GEM handle `handle`: `DRM_IOCTL_AMDGPU_GEM_OP
    /// (GET_GEM_CREATE_INFO)`, which only reads (ENOENT: no such handle).  Kernels before
    /// 6.18 take the 16-byte `drm_amdgpu_gem_op` and ignore the rest of the 24.
    pub fn gem_exists(&self, handle: u32) -> Result<bool> {
        let mut info = sys::drm_amdgpu_gem_create_in::default();
        let mut a = gem618::drm_amdgpu_gem_op {
            handle,
            op: sys::AMDGPU_GEM_OP_GET_GEM_CREATE_INFO,
            value: &mut info as *mut _ as u64,
            num_entries: 0,
            padding: 0,
        };
        match self.io(DRM_IOCTL_AMDGPU_GEM_OP, &mut a) {
            Ok(_) => Ok(true),
            Err(e) if e.errno() == libc::ENOENT => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Whether this file holds submission context `ctx_id`:
    /// `DRM_IOCTL_AMDGPU_CTX(GET_STABLE_PSTATE)`, which only reads (EINVAL: no such
    /// context; Linux 5.19 on).
    pub fn ctx_exists(&self, ctx_id: u32) -> Result<bool> {
        let mut a = sys::drm_amdgpu_ctx::default();
        a.in_ = sys::drm_amdgpu_ctx_in {
            op: sys::AMDGPU_CTX_OP_GET_STABLE_PSTATE,
            flags: 0,
            ctx_id,
            priority: 0,
        };
        match self.io(DRM_IOCTL_AMDGPU_CTX, &mut a) {
            Ok(_) => Ok(true),
            Err(e) if e.errno() == libc::EINVAL => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Creates a GEM BO in `domains` (`AMDGPU_GEM_DOMAIN_*`); returns its handle.
    pub fn gem_create(
        &self,
        size: u64,
        alignment: u64,
        domains: u64,
        domain_flags: u64,
    ) -> Result<u32> {
        let mut a = sys::drm_amdgpu_gem_create::default();
        a.in_ = sys::drm_amdgpu_gem_create_in {
            bo_size: size,
            alignment,
            domains,
            domain_flags,
        };
        self.io(DRM_IOCTL_AMDGPU_GEM_CREATE, &mut a)?;
        // SAFETY: after a successful GEM_CREATE the kernel wrote the `out` member.
        Ok(unsafe { a.out.handle })
    }

    /// Wraps `size` bytes of this process' memory at `addr` in a GEM BO.
    ///
    /// # Safety
    /// Once the BO is mapped in a GPU VM, the GPU reads and writes `[addr, addr + size)`
    /// behind the compiler's back. The caller must keep that range mapped, and not rely on
    /// its contents through Rust references, until the handle is closed (GEM_CLOSE) or the
    /// render node file is closed.
    pub unsafe fn gem_userptr(&self, addr: CpuVa, size: u64, flags: u32) -> Result<u32> {
        let mut a = sys::drm_amdgpu_gem_userptr {
            addr: addr.0,
            size,
            flags,
            handle: 0,
        };
        self.io(DRM_IOCTL_AMDGPU_GEM_USERPTR, &mut a)?;
        Ok(a.handle)
    }

    /// Maps, unmaps or replaces (`AMDGPU_VA_OP_*`) a GEM BO range in this file's GPU VM.
    pub fn gem_va(
        &self,
        handle: u32,
        operation: u32,
        flags: u32,
        va: GpuVa,
        offset_in_bo: u64,
        map_size: u64,
    ) -> Result<()> {
        let mut a = sys::drm_amdgpu_gem_va {
            handle,
            _pad: 0,
            operation,
            flags,
            va_address: va.0,
            offset_in_bo,
            map_size,
        };
        self.io(DRM_IOCTL_AMDGPU_GEM_VA, &mut a).map(drop)
    }

    /// Allocates a submission context; returns its id.
    pub fn ctx_alloc(&self, priority: i32) -> Result<u32> {
        let mut a = sys::drm_amdgpu_ctx::default();
        a.in_ = sys::drm_amdgpu_ctx_in {
            op: sys::AMDGPU_CTX_OP_ALLOC_CTX,
            flags: 0,
            ctx_id: 0,
            priority,
        };
        self.io(DRM_IOCTL_AMDGPU_CTX, &mut a)?;
        // SAFETY: after a successful ALLOC_CTX the kernel wrote the `out` member...
        let out = unsafe { a.out };
        // SAFETY: ...and within it the `alloc` variant.
        Ok(unsafe { out.alloc }.ctx_id)
    }

    /// `DRM_IOCTL_AMDGPU_CTX(FREE_CTX)`.
    pub fn ctx_free(&self, ctx_id: u32) -> Result<()> {
        let mut a = sys::drm_amdgpu_ctx::default();
        a.in_ = sys::drm_amdgpu_ctx_in {
            op: sys::AMDGPU_CTX_OP_FREE_CTX,
            flags: 0,
            ctx_id,
            priority: 0,
        };
        self.io(DRM_IOCTL_AMDGPU_CTX, &mut a).map(drop)
    }

    /// Creates a BO list for command submission; returns its handle.
    pub fn bo_list_create(&self, entries: &[sys::drm_amdgpu_bo_list_entry]) -> Result<u32> {
        let mut a = sys::drm_amdgpu_bo_list::default();
        a.in_ = sys::drm_amdgpu_bo_list_in {
            operation: sys::AMDGPU_BO_LIST_OP_CREATE,
            list_handle: 0,
            bo_number: entries.len() as u32,
            bo_info_size: std::mem::size_of::<sys::drm_amdgpu_bo_list_entry>() as u32,
            bo_info_ptr: entries.as_ptr() as u64,
        };
        self.io(DRM_IOCTL_AMDGPU_BO_LIST, &mut a)?;
        // SAFETY: after a successful OP_CREATE the kernel wrote the `out` member.
        Ok(unsafe { a.out.list_handle })
    }

    /// `DRM_IOCTL_AMDGPU_BO_LIST(DESTROY)`.
    pub fn bo_list_destroy(&self, list_handle: u32) -> Result<()> {
        let mut a = sys::drm_amdgpu_bo_list::default();
        a.in_ = sys::drm_amdgpu_bo_list_in {
            operation: sys::AMDGPU_BO_LIST_OP_DESTROY,
            list_handle,
            ..Default::default()
        };
        self.io(DRM_IOCTL_AMDGPU_BO_LIST, &mut a).map(drop)
    }

    /// Submits `chunks` (whose `chunk_data` point at live chunk payloads) on `ctx_id`;
    /// returns the submission's sequence number for [`wait_cs`](Self::wait_cs).
    ///
    /// # Safety
    /// The kernel reads each chunk's `chunk_data` as a pointer to `length_dw` dwords of
    /// this process' memory: every chunk must point at such memory, valid for the call.
    pub unsafe fn cs_submit(
        &self,
        ctx_id: u32,
        bo_list_handle: u32,
        chunks: &[sys::drm_amdgpu_cs_chunk],
    ) -> Result<u64> {
        // The kernel takes an array of pointers to chunks, not an array of chunks.
        let ptrs: Vec<u64> = chunks.iter().map(|c| c as *const _ as u64).collect();
        let mut a = sys::drm_amdgpu_cs::default();
        a.in_ = sys::drm_amdgpu_cs_in {
            ctx_id,
            bo_list_handle,
            num_chunks: chunks.len() as u32,
            flags: 0,
            chunks: ptrs.as_ptr() as u64,
        };
        self.io(DRM_IOCTL_AMDGPU_CS, &mut a)?;
        // SAFETY: after a successful CS the kernel wrote the `out` member.
        Ok(unsafe { a.out.handle })
    }

    /// Waits up to `timeout_ns` (absolute, CLOCK_MONOTONIC) for submission `seq`; returns
    /// true when it completed, false when it is still busy.  An interrupted wait is issued
    /// again with the same absolute deadline, so retries never extend it.
    pub fn wait_cs(
        &self,
        ctx_id: u32,
        ip_type: u32,
        ip_instance: u32,
        ring: u32,
        seq: u64,
        timeout_ns: u64,
    ) -> Result<bool> {
        let mut a = sys::drm_amdgpu_wait_cs::default();
        a.in_ = sys::drm_amdgpu_wait_cs_in {
            handle: seq,
            timeout: timeout_ns,
            ip_type,
            ip_instance,
            ring,
            ctx_id,
        };
        self.io(DRM_IOCTL_AMDGPU_WAIT_CS, &mut a)?;
        // SAFETY: after a successful WAIT_CS the kernel wrote the `out` member.
        Ok(unsafe { a.out.status } == 0)
    }
}

/// What a [`Mapping`] may be used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// `PROT_READ`.
    ReadOnly,
    /// `PROT_READ | PROT_WRITE`.
    ReadWrite,
}

/// A mapping owned by this value and unmapped on drop: of a device (or any)
/// fd, shared, or of private anonymous memory.  The one mmap RAII type of
/// the workspace.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    access: Access,
}

// SAFETY: the mapping is plain memory owned by this value; moving it between threads
// moves that ownership, and access goes through &self/&mut self.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` at `offset`, MAP_SHARED, read/write.
    pub fn shared(fd: BorrowedFd<'_>, offset: MmapOffset, len: usize) -> Result<Self> {
        Self::of_file(fd, offset, len, Access::ReadWrite, false)
    }

    /// Maps `len` bytes (non-zero) of `fd` at `offset` (page aligned), MAP_SHARED, for
    /// `access`; `populate` faults the pages in at once (MAP_POPULATE; pages a device cannot
    /// populate are simply not).
    pub fn of_file(
        fd: BorrowedFd<'_>,
        offset: MmapOffset,
        len: usize,
        access: Access,
        populate: bool,
    ) -> Result<Self> {
        if len == 0 || !offset.0.is_multiple_of(4096) {
            return Err(Error::new("mmap", libc::EINVAL));
        }
        let off =
            libc::off_t::try_from(offset.0).map_err(|_| Error::new("mmap", libc::EOVERFLOW))?;
        let flags = libc::MAP_SHARED | if populate { libc::MAP_POPULATE } else { 0 };
        Self::map(len, access, flags, fd.as_raw_fd(), off)
    }

    /// `len` bytes of zero-filled private anonymous memory, read/write.
    pub fn anonymous(len: usize) -> Result<Self> {
        Self::map(
            len,
            Access::ReadWrite,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    }

    fn map(
        len: usize,
        access: Access,
        flags: libc::c_int,
        fd: RawFd,
        off: libc::off_t,
    ) -> Result<Self> {
        let prot = match access {
            Access::ReadOnly => libc::PROT_READ,
            Access::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
        };
        // SAFETY: a fresh mapping chosen by the kernel (no MAP_FIXED) cannot alias memory Rust
        // already owns; the result is checked before use.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, off) };
        if p == libc::MAP_FAILED {
            return Err(Error::last("mmap"));
        }
        let ptr = NonNull::new(p.cast()).ok_or(Error::new("mmap", libc::EFAULT))?;
        Ok(Self { ptr, len, access })
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no byte is mapped (never, for a mapping made here).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What the mapping allows.
    pub fn access(&self) -> Access {
        self.access
    }

    /// The start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The start of the mapping (to register it with a device, say).
    pub fn as_non_null(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The mapped bytes, for copies in and out: a device or another process may change them
    /// at any time.  Writing through the slice of a read-only mapping faults (SIGSEGV).
    pub fn as_volatile_slice(&self) -> VolatileSlice<'_> {
        // SAFETY: `len` bytes mapped for as long as `self` is borrowed (a write to a read-only
        // mapping is refused by the MMU, not a write to anything else); `as_slice` and
        // `as_mut_slice` are unsafe, so no reference to the bytes lives beside this slice
        // without the caller's promise.
        unsafe { VolatileSlice::new(self.ptr, self.len) }
    }

    /// The mapped bytes as a Rust slice, without a copy.
    ///
    /// # Safety
    /// Nothing else (no GPU queue or engine, no other mapping of the same memory) writes the
    /// bytes while the slice lives: the caller has stopped every writer (paused the KFD
    /// process' queues, waited for the copy's fence).
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes, alive as long as `self`; nothing writes
        // them meanwhile (the caller's promise).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The mapped bytes as a mutable Rust slice, without a copy.
    ///
    /// # Safety
    /// Nothing else reads or writes the bytes while the slice lives (as for
    /// [`Mapping::as_slice`]).
    ///
    /// # Panics
    /// On a read-only mapping.
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        assert_eq!(self.access, Access::ReadWrite, "the mapping is read-only");
        // SAFETY: the mapping is `len` writable bytes, alive and exclusively borrowed; nothing
        // else touches them meanwhile (the caller's promise).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe a mapping this value created and nobody else unmaps.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    /// A call that fails with the given errnos in turn, then succeeds; records the
    /// argument (a WAIT_CS deadline) it was issued with each time.
    fn scripted<'a>(
        errnos: &'a [i32],
        arg: &sys::drm_amdgpu_wait_cs,
        seen: &'a std::cell::RefCell<Vec<u64>>,
    ) -> impl FnMut() -> Result<i32> + 'a {
        let mut script = errnos.iter().copied();
        // SAFETY: reading the `in_` member of a union the test initialised through it.
        let deadline = unsafe { arg.in_ }.timeout;
        move || {
            seen.borrow_mut().push(deadline);
            match script.next() {
                Some(e) => Err(Error::new("DRM_IOCTL_AMDGPU_WAIT_CS", e)),
                None => Ok(0),
            }
        }
    }

    #[test]
    fn restarts_on_eintr_and_eagain_with_the_same_deadline() {
        let mut a = sys::drm_amdgpu_wait_cs::default();
        a.in_ = sys::drm_amdgpu_wait_cs_in {
            handle: 7,
            timeout: 123_456_789,
            ..Default::default()
        };
        let seen = Default::default();
        let r = restarting(scripted(
            &[libc::EINTR, libc::EAGAIN, libc::EINTR, libc::EAGAIN],
            &a,
            &seen,
        ));
        assert_eq!(r, Ok(0));
        assert_eq!(
            *seen.borrow(),
            vec![123_456_789; 5],
            "one absolute deadline for all tries"
        );
    }

    #[test]
    fn other_errors_are_not_retried_and_eagain_is_bounded() {
        let a = sys::drm_amdgpu_wait_cs::default();
        let seen = Default::default();
        let r = restarting(scripted(&[libc::ECANCELED, libc::EINTR], &a, &seen));
        assert_eq!(r.unwrap_err().errno(), libc::ECANCELED);
        assert_eq!(
            seen.borrow().len(),
            1,
            "ECANCELED is an answer, not a reason to retry"
        );

        let seen = Default::default();
        let forever = vec![libc::EAGAIN; EAGAIN_RETRIES as usize + 5];
        let r = restarting(scripted(&forever, &a, &seen));
        assert_eq!(r.unwrap_err().errno(), libc::EAGAIN);
        assert_eq!(seen.borrow().len(), EAGAIN_RETRIES as usize + 1);

        // EINTRs between EAGAINs do not use up the EAGAIN budget.
        let mut mixed = Vec::new();
        for _ in 0..EAGAIN_RETRIES {
            mixed.extend([libc::EAGAIN, libc::EINTR]);
        }
        let seen = Default::default();
        assert_eq!(restarting(scripted(&mixed, &a, &seen)), Ok(0));
    }

    #[test]
    fn errors_keep_errno_and_name() {
        let null = File::open("/dev/null").unwrap();
        let kfd = Kfd::from_fd(null.as_fd());
        let e = kfd.get_version().unwrap_err();
        assert_eq!(e.errno(), libc::ENOTTY);
        assert_eq!(e.ioctl, "AMDKFD_IOC_GET_VERSION");
        assert_eq!(
            e.to_string(),
            "AMDKFD_IOC_GET_VERSION: Inappropriate ioctl for device (errno 25)"
        );
        let e = kfd.criu_process_info().unwrap_err();
        assert_eq!(e.ioctl, "AMDKFD_IOC_CRIU_OP(PROCESS_INFO)");
        // The safe allocation refuses USERPTR itself (EINVAL, not /dev/null's ENOTTY);
        // the unsafe one reaches the ioctl.
        let (gpu, va) = (GpuId(1), GpuVa(0x10_0000));
        let user = sys::KFD_IOC_ALLOC_MEM_FLAGS_USERPTR;
        let e = kfd.alloc_memory_of_gpu(gpu, va, 4096, user).unwrap_err();
        assert_eq!(
            (e.ioctl, e.errno()),
            ("AMDKFD_IOC_ALLOC_MEMORY_OF_GPU", libc::EINVAL)
        );
        let e = kfd.alloc_memory_of_gpu(gpu, va, 4096, 0).unwrap_err();
        assert_eq!(e.errno(), libc::ENOTTY);
        // SAFETY: /dev/null rejects the ioctl (ENOTTY): no BO is created, so nothing can
        // ever access the (unmapped) address.
        let r = unsafe { kfd.alloc_userptr_memory_of_gpu(gpu, va, 4096, 0, CpuVa(0x1000)) };
        assert_eq!(r.unwrap_err().errno(), libc::ENOTTY);
        let r = RenderNode::from_fd(null.as_fd());
        assert_eq!(r.drm_version().unwrap_err().ioctl, "DRM_IOCTL_VERSION");
        assert!(!e.is_eintr());
    }

    #[test]
    fn typed_render_ioctls_name_themselves() {
        let null = File::open("/dev/null").unwrap();
        let r = RenderNode::from_fd(null.as_fd());
        let names = [
            r.gem_create(4096, 4096, sys::AMDGPU_GEM_DOMAIN_GTT.into(), 0)
                .unwrap_err(),
            r.ctx_alloc(0).unwrap_err(),
            r.ctx_free(1).unwrap_err(),
            r.bo_list_create(&[]).unwrap_err(),
            r.bo_list_destroy(1).unwrap_err(),
            // SAFETY: no chunks, so no chunk pointer for the kernel to read.
            unsafe { r.cs_submit(1, 0, &[]) }.unwrap_err(),
            r.wait_cs(1, 0, 0, 0, 1, 0).unwrap_err(),
            r.prime_handle_to_fd(1, 0).unwrap_err(),
            // SAFETY: /dev/null rejects the ioctl (ENOTTY): no BO is created, so nothing
            // can ever access the (unmapped) address.
            unsafe { r.gem_userptr(CpuVa(0x1000), 4096, 0) }.unwrap_err(),
            r.gem_va(1, sys::AMDGPU_VA_OP_MAP, 0, GpuVa(0x10_0000), 0, 4096)
                .unwrap_err(),
        ];
        let expect = [
            "DRM_IOCTL_AMDGPU_GEM_CREATE",
            "DRM_IOCTL_AMDGPU_CTX",
            "DRM_IOCTL_AMDGPU_CTX",
            "DRM_IOCTL_AMDGPU_BO_LIST",
            "DRM_IOCTL_AMDGPU_BO_LIST",
            "DRM_IOCTL_AMDGPU_CS",
            "DRM_IOCTL_AMDGPU_WAIT_CS",
            "DRM_IOCTL_PRIME_HANDLE_TO_FD",
            "DRM_IOCTL_AMDGPU_GEM_USERPTR",
            "DRM_IOCTL_AMDGPU_GEM_VA",
        ];
        for (e, name) in names.iter().zip(expect) {
            assert_eq!(e.ioctl, name);
            assert_eq!(e.errno(), libc::ENOTTY, "{e}");
        }
    }

    #[test]
    fn missing_device_is_a_named_error() {
        let e = RenderNode::open(RenderMinor(255)).unwrap_err();
        assert_eq!(e.ioctl, "open(/dev/dri/renderD*)");
        assert_eq!(e.errno(), libc::ENOENT);
    }

    #[test]
    fn mapping_round_trip_on_a_memfd() {
        // SAFETY: memfd_create with a static NUL-terminated name; the result is checked.
        let raw = unsafe { libc::memfd_create(c"kfd-abi-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: `raw` is a fresh fd we own.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
        let file = File::from(fd);
        file.set_len(2 * 4096).unwrap();
        let a = Mapping::shared(file.as_fd(), MmapOffset(4096), 4096).unwrap();
        a.as_volatile_slice().copy_from(b"kfd!");
        let b = Mapping::shared(file.as_fd(), MmapOffset(4096), 4096).unwrap();
        assert_eq!(
            b.as_volatile_slice().read_u32(0),
            u32::from_le_bytes(*b"kfd!")
        );
        // SAFETY: nothing writes the file's pages while the slice lives.
        assert_eq!(&unsafe { b.as_slice() }[..4], b"kfd!");
        assert_eq!(b.len(), 4096);
        let r =
            Mapping::of_file(file.as_fd(), MmapOffset(0), 4096, Access::ReadOnly, true).unwrap();
        assert_eq!(r.access(), Access::ReadOnly);
        let anon = Mapping::anonymous(8192).unwrap();
        let mut out = [1u8; 16];
        anon.as_volatile_slice().copy_to(&mut out);
        assert_eq!(out, [0; 16], "zero-filled");
        let e = Mapping::of_file(file.as_fd(), MmapOffset(100), 4096, Access::ReadOnly, false)
            .unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "unaligned offset");
    }
}
