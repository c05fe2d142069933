//! The client proper: one /dev/kfd, one render node per GPU with its VM acquired, and BOs
//! that live at the same address for the CPU and the GPU, as the ROCm thunk arranges them.
//!
//! Like the thunk, the client also owns two BOs per GPU that the application never asks
//! for, both mapped on /dev/kfd at their GPU VA and GPU-mapped:
//!
//! * the MMIO remap page (`KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP`, one page), allocated at open
//!   on GFX9 and newer GPUs, through which the CPU flushes the GPU's HDP write buffer
//!   ([`Gpu::hdp_flush`]);
//! * the doorbell slice (`KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL`, [`DOORBELL_RANGE`] bytes),
//!   allocated with the GPU's first queue and holding the doorbells of all its queues.
//!
//! Both stay until the client is closed, and a checkpoint carries them like any other BO.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

use kfd_abi::handle::{Error as IoctlError, Kfd, RenderNode};
use kfd_abi::ids::{BoHandle, GpuId, GpuVa, MmapOffset, RenderMinor};
use kfd_abi::sys;
use kfd_abi::volatile::VolatileSlice;

use crate::error::{Error, Result};
use crate::topology::{self, Node};

/// Oldest KFD interface accepted: 1.8 is the first one whose CRIU op can checkpoint the BOs
/// this client makes, and checkpointing them is what the client exists for.
pub const MIN_KFD_MINOR: u32 = 8;

/// Bytes of the per-process doorbell range of one GPU on GFX9+ (1024 64-bit doorbells): the
/// size of the DOORBELL BO. CREATE_QUEUE returns an offset inside it; the BO is mapped from
/// its aligned start.
pub const DOORBELL_RANGE: u64 = 8192;

/// `KFD_IOC_ALLOC_MEM_FLAGS_*` of the doorbell BO, as the thunk allocates it.
pub const DOORBELL_ALLOC_FLAGS: u32 = sys::KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL
    | sys::KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE
    | sys::KFD_IOC_ALLOC_MEM_FLAGS_COHERENT;

/// `KFD_IOC_ALLOC_MEM_FLAGS_*` of the MMIO remap BO, as the thunk allocates it.
pub const MMIO_REMAP_ALLOC_FLAGS: u32 = sys::KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP
    | sys::KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE
    | sys::KFD_IOC_ALLOC_MEM_FLAGS_COHERENT;

/// Bytes of the MMIO remap BO: KFD accepts exactly one 4 KiB page.
pub const MMIO_REMAP_SIZE: u64 = 4096;

/// The thunk maps the MMIO remap page only on GPUs of GFX9 (Vega10, gfx_target_version
/// 9.0.0) and newer; older ones have no remap page.
const MMIO_MIN_GFX_VERSION: u64 = 90000;

/// Byte offset of HDP_MEM_FLUSH_CNTL in the MMIO remap page
/// (`KFD_MMIO_REMAP_HDP_MEM_FLUSH_CNTL`). Any write to it flushes the HDP.
const HDP_MEM_FLUSH_CNTL: u64 = 0;

/// One GPU as the process sees it.
#[derive(Debug)]
pub struct Gpu {
    /// Topology node number.
    pub node_id: u32,
    pub gpu_id: GpuId,
    pub minor: RenderMinor,
    /// Lowest and highest GPU VA usable for BOs (from GET_PROCESS_APERTURES_NEW).
    pub gpuvm_base: u64,
    pub gpuvm_limit: u64,
    render: RenderNode,
    /// The MMIO remap page, or why the GPU has none.
    mmio: std::result::Result<RawBo, String>,
    /// The doorbell slice, once the GPU's first queue exists.
    doorbell: Mutex<Option<RawBo>>,
}

/// A BO the client allocated by itself on one GPU (the doorbell slice or the MMIO remap
/// page), as KFD knows it.
#[derive(Debug, Copy, Clone, PartialEq, Eq)]
pub struct DeviceBo {
    pub handle: BoHandle,
    /// The GPU VA, which is also the CPU address of its /dev/kfd mapping.
    pub va: GpuVa,
    /// Size in bytes.
    pub size: u64,
    /// The `KFD_IOC_ALLOC_MEM_FLAGS_*` of the allocation.
    pub flags: u32,
    /// The `mmap_offset` ALLOC_MEMORY_OF_GPU returned. For MMIO it is the /dev/kfd offset
    /// of the page. For doorbells a real KFD returns no /dev/kfd offset here (it passes the
    /// doorbells' bus address to the allocation), so, as the thunk, the client maps the
    /// slice at the offset CREATE_QUEUE gave (`cpu_offset`).
    pub alloc_offset: MmapOffset,
    /// The /dev/kfd offset the CPU mapping was made at. A restore moves the mapping to the
    /// restored process' offset; this value stays the original one.
    pub cpu_offset: MmapOffset,
}

impl Gpu {
    /// The render node whose VM this process' KFD context uses for the GPU. VRAM and GTT
    /// BOs are CPU-mapped through it.
    pub fn render(&self) -> &RenderNode {
        &self.render
    }

    /// The MMIO remap page, allocated at open (None when the GPU has none; see
    /// [`mmio_unavailable`](Self::mmio_unavailable)).
    pub fn mmio_bo(&self) -> Option<DeviceBo> {
        self.mmio.as_ref().ok().map(RawBo::info)
    }

    /// The MMIO remap page's bytes (registers: read and write them as words), or None
    /// when the GPU has none.
    pub fn mmio(&self) -> Option<VolatileSlice<'_>> {
        let m = self.mmio.as_ref().ok()?;
        let ptr = NonNull::new(m.va.0 as *mut u8).expect("a BO is never mapped at 0");
        // SAFETY: the MMIO page is mapped read/write at `va` for `size` bytes for as long
        // as `self` lives: it is unmapped only when the client closes, which needs every
        // borrow of its GPUs gone; no Rust reference to it is ever made.
        Some(unsafe { VolatileSlice::new(ptr, m.size as usize) })
    }

    /// Why the GPU has no MMIO remap page: an older GPU, or KFD refused it (as the thunk,
    /// the client goes on without; only HDP flushes are lost).
    pub fn mmio_unavailable(&self) -> Option<&str> {
        self.mmio.as_ref().err().map(String::as_str)
    }

    /// The doorbell slice, once the GPU's first queue was created (it stays until close).
    pub fn doorbell_bo(&self) -> Option<DeviceBo> {
        self.doorbells().as_ref().map(RawBo::info)
    }

    /// Makes the CPU's earlier writes to this GPU's VRAM visible to the GPU: writes the HDP
    /// flush register through the MMIO remap page. Without that page it only orders the
    /// writes.
    pub fn hdp_flush(&self) {
        fence(Ordering::SeqCst);
        if let Ok(m) = &self.mmio {
            let reg = (m.va.0 + HDP_MEM_FLUSH_CNTL) as *const AtomicU32;
            // SAFETY: the MMIO page is mapped read/write at `va` (page aligned, so `reg` is
            // 4-byte aligned) for as long as `self` lives: it is unmapped only when the
            // client closes, which needs every borrow of its GPUs gone. An atomic store
            // makes concurrent flushes from several threads well defined.
            unsafe { (*reg).store(1, Ordering::Release) };
        }
    }

    fn doorbells(&self) -> MutexGuard<'_, Option<RawBo>> {
        // A panic while holding the lock cannot leave the Option half-written.
        self.doorbell.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn err(&self, source: IoctlError) -> Error {
        Error::Gpu {
            gpu: self.gpu_id,
            minor: self.minor,
            source,
        }
    }
}

/// An open KFD context with its GPUs ready for allocations. Dropping it (or
/// [`close`](Self::close)) frees the doorbell and MMIO BOs and closes the device files.
#[derive(Debug)]
pub struct KfdClient {
    kfd: Kfd,
    gpus: Vec<Gpu>,
    skipped: Vec<SkippedGpu>,
    topology_root: PathBuf,
}

/// Where a BO's memory lives.
#[derive(Debug, Copy, Clone, PartialEq, Eq)]
pub enum MemKind {
    /// Device memory, host-visible (needs a large BAR).
    Vram,
    /// System memory mapped through the GPU's GART.
    Gtt,
}

impl MemKind {
    /// The `KFD_IOC_ALLOC_MEM_FLAGS_*` the thunk would use for a CPU-accessible BO.
    pub const fn alloc_flags(self) -> u32 {
        let common =
            sys::KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE | sys::KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE;
        match self {
            MemKind::Vram => {
                common
                    | sys::KFD_IOC_ALLOC_MEM_FLAGS_VRAM
                    | sys::KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC
                    | sys::KFD_IOC_ALLOC_MEM_FLAGS_NO_SUBSTITUTE
            }
            MemKind::Gtt => common | sys::KFD_IOC_ALLOC_MEM_FLAGS_GTT,
        }
    }
}

/// A GPU of the topology this process cannot use because its render node cannot be opened
/// (it is not in this container's /dev, or a device cgroup denies it): skipped, as the
/// thunk skips it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SkippedGpu {
    pub node_id: u32,
    pub gpu_id: GpuId,
    pub minor: RenderMinor,
    /// ENOENT or EPERM.
    pub errno: i32,
}

/// Whether a failed render-node open only hides the GPU from this process. The thunk
/// (topology_sysfs_check_node_supported) leaves out a GPU whose render node open fails
/// with ENOENT or EPERM and fails on any other errno.
fn hides_gpu(errno: i32) -> bool {
    errno == libc::ENOENT || errno == libc::EPERM
}

fn page_size() -> u64 {
    // SAFETY: sysconf only reads a system constant.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p).unwrap_or(4096)
}

impl KfdClient {
    /// Opens /dev/kfd and every GPU of the system topology whose render node this process
    /// can open; the others are skipped (see [`skipped_gpus`](Self::skipped_gpus)).
    pub fn open() -> Result<Self> {
        Self::open_with_topology(Path::new(topology::DEFAULT_ROOT))
    }

    /// As [`open`](Self::open), reading the topology from `root` (a copy of
    /// `/sys/class/kfd/kfd/topology`).
    pub fn open_with_topology(root: &Path) -> Result<Self> {
        let kfd = open_kfd()?;
        let nodes = topology::read_nodes(root)?;
        let (mut gpus, gfx_versions, skipped) = acquire_gpus(&kfd, &nodes, root)?;
        set_apertures(&kfd, &mut gpus, nodes.len())?;
        // The MMIO remap pages last, as the thunk does once the apertures are known.
        let mut client = Self {
            kfd,
            gpus,
            skipped,
            topology_root: root.to_owned(),
        };
        let Self { kfd, gpus, .. } = &mut client;
        for (g, gfx) in gpus.iter_mut().zip(gfx_versions) {
            g.mmio = mmio_page(kfd, g, gfx);
        }
        Ok(client)
    }

    /// The /dev/kfd handle, for ioctls this client does not wrap (queues, events, CRIU).
    pub fn kfd(&self) -> &Kfd {
        &self.kfd
    }

    /// The GPUs, in topology order.
    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    /// The GPUs of the topology left out because their render node cannot be opened here.
    pub fn skipped_gpus(&self) -> &[SkippedGpu] {
        &self.skipped
    }

    /// Where the topology was read from.
    pub fn topology_root(&self) -> &Path {
        &self.topology_root
    }

    /// A GPU by gpu_id.
    pub fn gpu(&self, gpu_id: GpuId) -> Result<&Gpu> {
        self.gpus
            .iter()
            .find(|g| g.gpu_id == gpu_id)
            .ok_or(Error::UnknownGpu(gpu_id))
    }

    /// Allocates `size` bytes (rounded up to pages) of `kind` memory on `gpu`, maps it into
    /// the GPU's VM and into this process at the same address.
    pub fn alloc(&self, gpu_id: GpuId, size: u64, kind: MemKind) -> Result<Bo<'_>> {
        self.alloc_with_flags(gpu_id, size, kind.alloc_flags())
    }

    /// As [`alloc`](Self::alloc) with explicit `KFD_IOC_ALLOC_MEM_FLAGS_*` (VRAM or GTT).
    pub fn alloc_with_flags(&self, gpu_id: GpuId, size: u64, flags: u32) -> Result<Bo<'_>> {
        let gpu = self.gpu(gpu_id)?;
        let raw = alloc_raw(&self.kfd, gpu, size, flags, CpuMap::Render)?;
        Ok(Bo { client: self, raw })
    }

    /// The address of a queue's doorbell inside the doorbell slice of `gpu_id`, from the
    /// `doorbell_offset` CREATE_QUEUE returned (the slice's /dev/kfd offset plus the
    /// doorbell's byte offset in it, on GFX9+). The GPU's first queue allocates the slice
    /// (DOORBELL BO), maps it on /dev/kfd at that offset and on the GPU, as the thunk does.
    pub(crate) fn doorbell(
        &self,
        gpu_id: GpuId,
        doorbell_offset: u64,
    ) -> Result<VolatileSlice<'_>> {
        let gpu = self.gpu(gpu_id)?;
        let mut slot = gpu.doorbells();
        let va = match &*slot {
            Some(bo) => bo.va,
            None => {
                let base = MmapOffset(doorbell_offset & !(DOORBELL_RANGE - 1));
                let bo = alloc_raw(
                    &self.kfd,
                    gpu,
                    DOORBELL_RANGE,
                    DOORBELL_ALLOC_FLAGS,
                    CpuMap::KfdAt(base),
                )?;
                slot.insert(bo).va
            }
        };
        let at = va.0 + (doorbell_offset & (DOORBELL_RANGE - 1));
        let ptr = NonNull::new(at as *mut u8).expect("a BO is never mapped at 0");
        // SAFETY: the doorbell (8 bytes; KFD hands out doorbells on 8-byte boundaries inside
        // the page-aligned slice) lies in the GPU's doorbell BO, a writable /dev/kfd mapping
        // freed only when the client (which `&self` borrows) closes; no Rust reference to
        // it is ever made.
        Ok(unsafe { VolatileSlice::new(ptr, 8) })
    }

    /// Frees the doorbell and MMIO BOs, then closes /dev/kfd and the render nodes; reports
    /// the first failure (dropping the client does the same without reporting).
    pub fn close(mut self) -> Result<()> {
        self.release_device_bos()
    }

    fn release_device_bos(&mut self) -> Result<()> {
        let mut first = None;
        for g in &mut self.gpus {
            let doorbell = g
                .doorbell
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            let mmio = std::mem::replace(&mut g.mmio, Err("freed".to_owned())).ok();
            for mut bo in doorbell.into_iter().chain(mmio) {
                if let Err(e) = bo.release(&self.kfd) {
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for KfdClient {
    fn drop(&mut self) {
        // Before the fields close /dev/kfd. Errors cannot be reported from drop; `close`
        // reports them.
        let _ = self.release_device_bos();
    }
}

/// Which file and offset a BO's CPU mapping comes from.
#[derive(Debug, Copy, Clone)]
enum CpuMap {
    /// The render node, at the offset ALLOC_MEMORY_OF_GPU returned (VRAM, GTT).
    Render,
    /// /dev/kfd, at the offset ALLOC_MEMORY_OF_GPU returned (MMIO remap).
    Kfd,
    /// /dev/kfd, at this offset (doorbells: the slice's offset from CREATE_QUEUE).
    KfdAt(MmapOffset),
}

impl CpuMap {
    fn steps(self) -> (&'static str, &'static str) {
        match self {
            CpuMap::Render => (
                "AMDKFD_IOC_ALLOC_MEMORY_OF_GPU",
                "mmap render node at the BO's offset",
            ),
            CpuMap::Kfd => (
                "AMDKFD_IOC_ALLOC_MEMORY_OF_GPU (MMIO remap page)",
                "mmap /dev/kfd at the MMIO page's offset",
            ),
            CpuMap::KfdAt(_) => (
                "AMDKFD_IOC_ALLOC_MEMORY_OF_GPU (doorbell slice)",
                "mmap /dev/kfd at the doorbell slice's offset",
            ),
        }
    }
}

/// /dev/kfd, of an interface version this client speaks.
fn open_kfd() -> Result<Kfd> {
    let kfd = Kfd::open().map_err(Error::Kfd)?;
    let (major, minor) = kfd.get_version().map_err(Error::Kfd)?;
    if major != 1 || minor < MIN_KFD_MINOR {
        return Err(Error::Version {
            major,
            minor,
            min_minor: MIN_KFD_MINOR,
        });
    }
    Ok(kfd)
}

/// The GPUs acquired, their gfx_target_versions (in the same order) and the
/// GPUs skipped.
type AcquiredGpus = (Vec<Gpu>, Vec<Option<u64>>, Vec<SkippedGpu>);

/// The GPUs of the topology whose render node this process can open, each
/// acquired (ACQUIRE_VM), with their gfx_target_version; and those skipped
/// because their node is hidden (a container given some of the GPUs).
fn acquire_gpus(kfd: &Kfd, nodes: &[Node], root: &Path) -> Result<AcquiredGpus> {
    let gpu_nodes: Vec<&Node> = nodes.iter().filter(|n| n.gpu_id.is_some()).collect();
    if gpu_nodes.is_empty() {
        return Err(Error::NoGpu {
            path: root.join("nodes"),
        });
    }
    let mut gpus = Vec::with_capacity(gpu_nodes.len());
    let mut gfx_versions = Vec::with_capacity(gpu_nodes.len());
    let mut skipped = Vec::new();
    for n in gpu_nodes {
        // read_nodes guarantees both for GPU nodes.
        let (Some(gpu_id), Some(minor)) = (n.gpu_id, n.render_minor()) else {
            continue;
        };
        let render = match RenderNode::open(minor) {
            Ok(r) => r,
            Err(e) if hides_gpu(e.errno()) => {
                skipped.push(SkippedGpu {
                    node_id: n.node_id,
                    gpu_id,
                    minor,
                    errno: e.errno(),
                });
                continue;
            }
            Err(source) => {
                return Err(Error::Gpu {
                    gpu: gpu_id,
                    minor,
                    source,
                })
            }
        };
        let gpu = Gpu {
            node_id: n.node_id,
            gpu_id,
            minor,
            gpuvm_base: 0,
            gpuvm_limit: 0,
            render,
            mmio: Err("not allocated yet".to_owned()),
            doorbell: Mutex::new(None),
        };
        kfd.acquire_vm(gpu_id, gpu.render.as_fd())
            .map_err(|e| gpu.err(e))?;
        gpus.push(gpu);
        gfx_versions.push(n.property("gfx_target_version"));
    }
    if gpus.is_empty() {
        return Err(Error::NoUsableGpu {
            path: root.join("nodes"),
            skipped: skipped.len(),
        });
    }
    Ok((gpus, gfx_versions, skipped))
}

/// Each GPU's GPUVM aperture from GET_PROCESS_APERTURES_NEW, asked with room
/// for all `nodes`, as the thunk asks: KFD reports the process' devices in
/// its own order, which may hold GPUs this process skipped.
fn set_apertures(kfd: &Kfd, gpus: &mut [Gpu], nodes: usize) -> Result<()> {
    let apertures = kfd.get_process_apertures_new(nodes).map_err(Error::Kfd)?;
    for g in gpus {
        let ap = apertures
            .iter()
            .find(|a| a.gpu_id == g.gpu_id.0)
            .ok_or_else(|| {
                g.err(IoctlError {
                    ioctl: "AMDKFD_IOC_GET_PROCESS_APERTURES_NEW",
                    errno: libc::ENODEV,
                })
            })?;
        g.gpuvm_base = ap.gpuvm_base;
        g.gpuvm_limit = ap.gpuvm_limit;
    }
    Ok(())
}

/// GPU `g`'s MMIO remap page (GFX9 and newer, by its gfx_target_version
/// `gfx`), or why it has none. A GPU whose page KFD refuses keeps working
/// without it (the thunk only logs that).
fn mmio_page(kfd: &Kfd, g: &Gpu, gfx: Option<u64>) -> std::result::Result<RawBo, String> {
    match gfx {
        Some(v) if v >= MMIO_MIN_GFX_VERSION => {
            alloc_raw(kfd, g, MMIO_REMAP_SIZE, MMIO_REMAP_ALLOC_FLAGS, CpuMap::Kfd)
                .map_err(|e| e.to_string())
        }
        Some(v) => Err(format!(
            "GPU {}: gfx_target_version {v} is older than GFX9: no MMIO remap page",
            g.gpu_id.get()
        )),
        None => Err(format!(
            "GPU {}: the topology gives no gfx_target_version: no MMIO remap page",
            g.gpu_id.get()
        )),
    }
}

/// Allocates `size` bytes (rounded up to pages) with `flags` on `gpu`, maps it into this
/// process at the BO's GPU VA as `map` says, then into the GPU's VM. On failure whatever
/// was set up is undone.
fn alloc_raw(kfd: &Kfd, gpu: &Gpu, size: u64, flags: u32, map: CpuMap) -> Result<RawBo> {
    let gpu_id = gpu.gpu_id;
    let page = page_size();
    let size = match size.checked_add(page - 1) {
        Some(s) if size != 0 => s & !(page - 1),
        _ => return Err(Error::BadSize { gpu: gpu_id, size }),
    };
    let len = usize::try_from(size).map_err(|_| Error::BadSize { gpu: gpu_id, size })?;
    // The CPU address space decides the address: reserve it first, then make the GPU
    // allocation there, so the BO needs no separate CPU and GPU addresses.
    let reservation = Reservation::new(len).map_err(|source| Error::Bo {
        gpu: gpu_id,
        va: GpuVa(0),
        size,
        step: "reserve CPU address range",
        source,
    })?;
    let va = GpuVa(reservation.addr);
    if va.0 < gpu.gpuvm_base || va.0 + size - 1 > gpu.gpuvm_limit {
        return Err(Error::Aperture {
            gpu: gpu_id,
            va,
            size,
            base: gpu.gpuvm_base,
            limit: gpu.gpuvm_limit,
        });
    }
    let bo_err = |step, source| Error::Bo {
        gpu: gpu_id,
        va,
        size,
        step,
        source,
    };
    let (alloc_step, mmap_step) = map.steps();
    let (handle, offset) = kfd
        .alloc_memory_of_gpu(gpu_id, va, size, flags)
        .map_err(|e| bo_err(alloc_step, e))?;
    let (fd, cpu_offset) = match map {
        CpuMap::Render => (gpu.render.as_fd(), offset),
        CpuMap::Kfd => (kfd.as_fd(), offset),
        CpuMap::KfdAt(o) => (kfd.as_fd(), o),
    };
    let mut bo = RawBo {
        gpu: gpu_id,
        handle,
        va,
        size,
        offset,
        cpu_offset,
        flags,
        cpu: Some(reservation),
        gpu_mapped: false,
    };
    let mapped = bo
        .cpu_map(fd)
        .map_err(|e| bo_err(mmap_step, e))
        .and_then(|()| {
            match kfd.map_memory_to_gpu(handle, &[gpu_id]) {
                Ok(1) => Ok(()),
                Ok(_) => Err(IoctlError {
                    ioctl: "AMDKFD_IOC_MAP_MEMORY_TO_GPU",
                    errno: libc::EIO,
                }),
                Err(e) => Err(e),
            }
            .map_err(|e| bo_err("AMDKFD_IOC_MAP_MEMORY_TO_GPU", e))
        });
    match mapped {
        Ok(()) => {
            bo.gpu_mapped = true;
            Ok(bo)
        }
        Err(e) => {
            let _ = bo.release(kfd);
            Err(e)
        }
    }
}

/// An anonymous `PROT_NONE` range owned by this process, unmapped on drop. A BO's CPU
/// mapping replaces it in place, so dropping it also removes the BO's CPU mapping.
#[derive(Debug)]
struct Reservation {
    addr: u64,
    len: usize,
}

impl Reservation {
    fn new(len: usize) -> std::result::Result<Self, IoctlError> {
        // SAFETY: a fresh anonymous mapping at a kernel-chosen address touches no memory Rust
        // already owns; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last_error("mmap(PROT_NONE)"));
        }
        Ok(Self {
            addr: p as u64,
            len,
        })
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // SAFETY: the range was mapped by `Reservation::new` (possibly replaced in place by the
        // BO's MAP_FIXED mapping) and belongs only to this value.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

fn last_error(ioctl: &'static str) -> IoctlError {
    IoctlError {
        ioctl,
        errno: std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO),
    }
}

/// A BO as allocated, CPU-mapped and GPU-mapped, without a borrow of the client: what
/// [`Bo`] wraps and what the client keeps for its doorbell and MMIO BOs. Freed only by
/// [`release`](RawBo::release).
#[derive(Debug)]
struct RawBo {
    gpu: GpuId,
    handle: BoHandle,
    va: GpuVa,
    size: u64,
    /// What ALLOC_MEMORY_OF_GPU returned in `mmap_offset`.
    offset: MmapOffset,
    /// Where the CPU mapping was made.
    cpu_offset: MmapOffset,
    flags: u32,
    /// Present while the BO is allocated.
    cpu: Option<Reservation>,
    gpu_mapped: bool,
}

impl RawBo {
    fn info(&self) -> DeviceBo {
        DeviceBo {
            handle: self.handle,
            va: self.va,
            size: self.size,
            flags: self.flags,
            alloc_offset: self.offset,
            cpu_offset: self.cpu_offset,
        }
    }

    fn cpu_map(&mut self, fd: BorrowedFd<'_>) -> std::result::Result<(), IoctlError> {
        let off = libc::off_t::try_from(self.cpu_offset.0).map_err(|_| IoctlError {
            ioctl: "mmap",
            errno: libc::EOVERFLOW,
        })?;
        // SAFETY: MAP_FIXED replaces only our own PROT_NONE reservation of exactly this range
        // (`self.cpu`), which nothing else uses; the fd is open for the call.
        let p = unsafe {
            libc::mmap(
                self.va.0 as *mut libc::c_void,
                self.size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last_error("mmap"));
        }
        Ok(())
    }

    /// Unmaps the BO from the GPU and the CPU and frees it; a second call does nothing.
    fn release(&mut self, kfd: &Kfd) -> Result<()> {
        let mut first = None;
        let (gpu, va, size) = (self.gpu, self.va, self.size);
        let bo_err = |step, source| Error::Bo {
            gpu,
            va,
            size,
            step,
            source,
        };
        if std::mem::take(&mut self.gpu_mapped) {
            if let Err(e) = kfd.unmap_memory_from_gpu(self.handle, &[gpu]) {
                first.get_or_insert(bo_err("AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU", e));
            }
        }
        if let Some(cpu) = self.cpu.take() {
            drop(cpu);
            if let Err(e) = kfd.free_memory_of_gpu(self.handle) {
                first.get_or_insert(bo_err("AMDKFD_IOC_FREE_MEMORY_OF_GPU", e));
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// A VRAM or GTT BO, GPU-mapped on its GPU and CPU-mapped at its GPU VA. Dropping it unmaps
/// and frees it; [`free`](Bo::free) does the same and reports errors.
#[derive(Debug)]
pub struct Bo<'c> {
    client: &'c KfdClient,
    raw: RawBo,
}

impl Bo<'_> {
    pub fn gpu(&self) -> GpuId {
        self.raw.gpu
    }

    pub fn handle(&self) -> BoHandle {
        self.raw.handle
    }

    /// The GPU VA, which is also the CPU address.
    pub fn va(&self) -> GpuVa {
        self.raw.va
    }

    /// Size in bytes (page aligned).
    pub fn size(&self) -> u64 {
        self.raw.size
    }

    /// The render-node offset ALLOC_MEMORY_OF_GPU returned, as mapped.
    pub fn mmap_offset(&self) -> MmapOffset {
        self.raw.offset
    }

    /// The `KFD_IOC_ALLOC_MEM_FLAGS_*` of the allocation.
    pub fn flags(&self) -> u32 {
        self.raw.flags
    }

    /// The BO's bytes through its CPU mapping, for copies in and out: a GPU engine may
    /// change them at any time.
    pub fn volatile(&self) -> VolatileSlice<'_> {
        let ptr = NonNull::new(self.raw.va.0 as *mut u8).expect("a BO is never mapped at 0");
        // SAFETY: while `self` lives, `va..va+size` is a readable and writable MAP_SHARED
        // mapping of the BO (made in `alloc_raw`, removed only by `RawBo::release`); no Rust
        // reference to it is ever made (the BO is reached through VolatileSlice only).
        unsafe { VolatileSlice::new(ptr, self.raw.size as usize) }
    }

    /// A copy of the BO's bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.raw.size as usize];
        self.volatile().copy_to(&mut v);
        v
    }

    /// Unmaps the BO from the GPU and the CPU and frees it.
    pub fn free(mut self) -> Result<()> {
        self.raw.release(&self.client.kfd)
    }
}

impl Drop for Bo<'_> {
    fn drop(&mut self) {
        // Errors cannot be reported from drop; `free` reports them.
        let _ = self.raw.release(&self.client.kfd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_kinds_map_to_thunk_flags() {
        let v = MemKind::Vram.alloc_flags();
        assert_eq!(v & 0x1f, sys::KFD_IOC_ALLOC_MEM_FLAGS_VRAM);
        assert_ne!(v & sys::KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC, 0);
        assert_ne!(v & sys::KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE, 0);
        let g = MemKind::Gtt.alloc_flags();
        assert_eq!(g & 0x1f, sys::KFD_IOC_ALLOC_MEM_FLAGS_GTT);
        assert_eq!(g & sys::KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC, 0);
    }

    #[test]
    fn reservation_is_inaccessible_and_released() {
        // Other tests run on other threads of this process and may map
        // memory into the hole a dropped reservation leaves, so "released"
        // is proven by mapping that exact range again, and an attempt
        // another thread got in the way of is repeated.
        for _ in 0..5 {
            let r = Reservation::new(8192).unwrap();
            let addr = r.addr;
            assert_eq!(addr % page_size(), 0);
            let mut vec = [0u8; 2];
            // SAFETY: mincore only inspects the page table for our own range.
            let rc = unsafe { libc::mincore(addr as *mut libc::c_void, 8192, vec.as_mut_ptr()) };
            assert_eq!(rc, 0);
            drop(r);
            // SAFETY: MAP_FIXED_NOREPLACE never replaces a mapping: it
            // fails with EEXIST where anything is still (or again) mapped.
            let p = unsafe {
                libc::mmap(
                    addr as *mut libc::c_void,
                    8192,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                let e = std::io::Error::last_os_error();
                assert_eq!(e.raw_os_error(), Some(libc::EEXIST), "{e}");
                continue;
            }
            assert_eq!(p as u64, addr, "the range must be free again");
            // SAFETY: unmapping the probe mapping made just above.
            assert_eq!(unsafe { libc::munmap(p, 8192) }, 0);
            return;
        }
        panic!("the dropped reservation's range stayed mapped in 5 attempts");
    }
}
