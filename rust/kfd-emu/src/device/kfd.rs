//! /dev/kfd ioctls (except CRIU_OP, see `criu`): decode the argument
//! struct, act on the fd's process, encode the answer.

use std::collections::BTreeSet;
use std::mem::size_of;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::aql;
use super::dmabuf::Dmabuf;
use super::mem::{user_read, user_write};
use super::shader::{SaveJob, Saved};
use super::state::{
    Answer, Bo, BoKey, Done, Event, Fired, MemoryException, Queue, SignalPage, State, WaitEnd,
    WaitReply, Waiter, R,
};
use super::uapi::{self, alloc, event_type, kfd_off, queue_type, sys};
use super::{Caller, FdResolver, Replier};

fn proc_mut(st: &mut State, lead: u32) -> R<&mut super::state::Proc> {
    st.procs.get_mut(&lead).ok_or(libc::ESRCH)
}

/// GET_VERSION: 1.`minor` of the profile.
pub fn get_version(st: &State, a: &mut sys::kfd_ioctl_get_version_args) -> R<()> {
    a.major_version = uapi::KFD_MAJOR;
    a.minor_version = st.devs.kfd_minor;
    Ok(())
}

/// EXPORT_DMABUF's checks (`kfd_ioctl_export_dmabuf`): the handle's GPU
/// and BO must be the process', and amdgpu exports no userptr BO (EPERM)
/// nor a doorbell or MMIO one (EINVAL).  Returns the BO to export.  Over
/// FUSE no fd can be installed: the answer is EOPNOTSUPP there (the
/// supervisor hands the dma-buf out, `supervised`).
pub fn export_dmabuf(
    st: &mut State,
    lead: u32,
    a: &mut super::uapi::layout::kfd_ioctl_export_dmabuf_args,
) -> R<BoKey> {
    let p = proc_mut(st, lead)?;
    let key = bo_of_handle(p, a.handle)?;
    let flags = p.bos.get(&key).ok_or(libc::EINVAL)?.flags;
    if flags & alloc::USERPTR != 0 {
        return Err(libc::EPERM);
    }
    if flags & (alloc::VRAM | alloc::GTT) == 0 {
        return Err(libc::EINVAL);
    }
    Ok(key)
}

pub fn apertures_new(
    st: &mut State,
    lead: u32,
    caller: &Caller,
    a: &mut sys::kfd_ioctl_get_process_apertures_new_args,
) -> R<()> {
    let p = proc_mut(st, lead)?;
    let n = a.num_of_nodes;
    if n == 0 {
        a.num_of_nodes = p.n_pdds() as u32;
        return Ok(());
    }
    let n = (n as usize).min(p.n_pdds());
    let mut out = Vec::new();
    for (_, pdd) in p.present().take(n) {
        uapi::push(&mut out, &aperture(pdd.user_id));
    }
    user_write(caller.tid, a.kfd_process_device_apertures_ptr, &out)?;
    a.num_of_nodes = n as u32;
    Ok(())
}

/// Binds pdd `gpu` to the render-node open `fh` (ACQUIRE_VM, and the
/// equivalent step of CRIU RESTORE).
pub fn bind_vm(st: &mut State, lead: u32, gpu: usize, fh: u64) -> R<()> {
    if st.opens.get(&fh).and_then(super::state::Open::render_gpu) != Some(gpu) {
        return Err(libc::EINVAL);
    }
    let p = proc_mut(st, lead)?;
    match p.pdds[gpu].vm {
        Some(old) if old == fh => Ok(()),
        Some(_) => Err(libc::EBUSY),
        None => {
            p.pdds[gpu].vm = Some(fh);
            Ok(())
        }
    }
}

pub fn acquire_vm(
    st: &mut State,
    lead: u32,
    caller: &Caller,
    res: &dyn FdResolver,
    a: &mut sys::kfd_ioctl_acquire_vm_args,
) -> R<()> {
    let p = proc_mut(st, lead)?;
    let gpu = p.pdd_by_user_id(a.gpu_id).ok_or(libc::EINVAL)?;
    let fh = res.open_of(caller.tgid, a.drm_fd as i32)?;
    bind_vm(st, lead, gpu, fh)
}

/// The pdd of `user_gpu` as `kfd_bind_process_to_device` finds it: EINVAL
/// when the process has no such device, `unbound` when no render node's VM
/// was acquired for it (the ioctls differ: the bind itself fails with
/// ENODEV, and some of them report any bind failure as ESRCH).
fn bound_pdd(st: &mut State, lead: u32, user_gpu: u32, unbound: i32) -> R<usize> {
    let p = proc_mut(st, lead)?;
    let gpu = p.pdd_by_user_id(user_gpu).ok_or(libc::EINVAL)?;
    if p.pdds[gpu].vm.is_none() {
        return Err(unbound);
    }
    Ok(gpu)
}

/// The BO of `handle` for MAP/UNMAP: EINVAL when the handle names no
/// device of the process, ENOMEM when no BO (KFD's answer when the IDR
/// lookup fails there).
fn bo_of_handle(p: &super::state::Proc, handle: u64) -> R<BoKey> {
    let gpu = p
        .pdd_by_user_id((handle >> 32) as u32)
        .ok_or(libc::EINVAL)?;
    let key = BoKey {
        gpu,
        idr: handle as u32,
    };
    if !p.bos.contains_key(&key) {
        return Err(libc::ENOMEM);
    }
    Ok(key)
}

/// Creates a BO with the given IDR id (fresh when None) and returns its key
/// and mmap offset.  Shared by ALLOC_MEMORY_OF_GPU and CRIU RESTORE.
#[allow(clippy::too_many_arguments)]
pub fn create_bo(
    st: &mut State,
    lead: u32,
    gpu: usize,
    va: u64,
    size: u64,
    flags: u32,
    user_addr: u64,
    idr: Option<u32>,
) -> R<(BoKey, u64)> {
    let mem_type = flags & alloc::TYPE_MASK;
    let size = checked_bo_range(va, size, mem_type)?;
    let p = proc_mut(st, lead)?;
    if p.bos.va_taken(va, size) {
        return Err(libc::EINVAL);
    }
    let idr = bo_idr(p, gpu, idr)?;
    let slot = p.slot;
    let (offset, map) = bo_backing(st, gpu, slot, flags, size, user_addr)?;
    let p = proc_mut(st, lead)?;
    let bo = Bo {
        va,
        size,
        flags,
        offset,
        user_addr: if mem_type == alloc::USERPTR {
            user_addr
        } else {
            0
        },
        map,
        mapped: BTreeSet::new(),
        imported: false,
    };
    Ok((insert_bo(p, gpu, idr, bo), offset))
}

/// Puts `bo` in the process' IDR of `gpu` at `idr`.
fn insert_bo(p: &mut super::state::Proc, gpu: usize, idr: u32, bo: Bo) -> BoKey {
    let key = BoKey { gpu, idr };
    p.bos.insert(key, bo);
    key
}

/// A BO's size rounded up to pages, once its memory type (one bit) and
/// GPU VA range (page aligned, inside the GPUVM aperture) are valid.
fn checked_bo_range(va: u64, size: u64, mem_type: u32) -> R<u64> {
    if size == 0 || !mem_type.is_power_of_two() {
        return Err(libc::EINVAL);
    }
    let size = super::state::page_align(size).ok_or(libc::EINVAL)?;
    if !va.is_multiple_of(uapi::PAGE)
        || va < uapi::GPUVM_BASE
        || va
            .checked_add(size)
            .is_none_or(|e| e - 1 > uapi::GPUVM_LIMIT)
    {
        return Err(libc::EINVAL);
    }
    Ok(size)
}

/// The BO's IDR id on `gpu`: `idr` when free (CRIU RESTORE's
/// `idr_alloc(idr, idr + 1)`, ENOMEM when taken), else the lowest free id
/// from 0, as `kfd_process_device_create_obj_handle`'s `idr_alloc(0, 0)`
/// hands out (a freed BO's id is given again).
fn bo_idr(p: &super::state::Proc, gpu: usize, idr: Option<u32>) -> R<u32> {
    match idr {
        Some(i) if p.bos.contains_key(&BoKey { gpu, idr: i }) => Err(libc::ENOMEM),
        Some(i) => Ok(i),
        None => p.bos.lowest_free_idr(gpu).ok_or(libc::ENOSPC),
    }
}

/// Where the BO's memory is: its mmap offset and, for VRAM and GTT, the
/// reserved memory; a USERPTR's offset is its user address.
fn bo_backing(
    st: &mut State,
    gpu: usize,
    slot: u32,
    flags: u32,
    size: u64,
    user_addr: u64,
) -> R<(u64, Option<Arc<super::mem::Mapping>>)> {
    let mem_type = flags & alloc::TYPE_MASK;
    match mem_type {
        alloc::VRAM | alloc::GTT => {
            if mem_type == alloc::VRAM
                && flags & alloc::PUBLIC != 0
                && !st.devs.gpus[gpu].vram_public
            {
                // Host-visible VRAM is refused on small-BAR boards.
                return Err(libc::EINVAL);
            }
            let (off, m) = st.reserve(gpu, mem_type, size)?;
            Ok((off, Some(m)))
        }
        alloc::USERPTR => {
            if !user_addr.is_multiple_of(uapi::PAGE) {
                return Err(libc::EINVAL);
            }
            Ok((user_addr, None))
        }
        alloc::DOORBELL => {
            if size != uapi::DOORBELL_SLICE {
                return Err(libc::EINVAL);
            }
            Ok((kfd_off::encode(kfd_off::DOORBELL, slot, gpu, 0), None))
        }
        alloc::MMIO_REMAP => {
            if size != uapi::PAGE {
                return Err(libc::EINVAL);
            }
            Ok((kfd_off::encode(kfd_off::MMIO, slot, gpu, 0), None))
        }
        _ => Err(libc::EINVAL),
    }
}

/// ALLOC_MEMORY_OF_GPU.  `mmap_offset` is the CPU address on input for
/// USERPTR; on output the offset to mmap (see `uapi::kfd_off` and
/// `uapi::RENDER_OFFSET_BASE`).
pub fn alloc_memory(
    st: &mut State,
    lead: u32,
    caller: &Caller,
    a: &mut sys::kfd_ioctl_alloc_memory_of_gpu_args,
) -> R<()> {
    let flags = a.flags;
    if a.size == 0 {
        return Err(libc::EINVAL);
    }
    // A VA an SVM range covers is taken (VRAM without a VA aside).
    if !(a.va_addr == 0 && flags & alloc::VRAM != 0) {
        let p = proc_mut(st, lead)?;
        if super::state::svm::overlaps(p, a.va_addr, a.size) {
            // Only a mapping can end a range: look again after trimming.
            let vmas = super::state::svm::vmas(lead)?;
            super::state::svm::trim(p, &vmas);
            if super::state::svm::overlaps(p, a.va_addr, a.size) {
                return Err(libc::EADDRINUSE);
            }
        }
    }
    {
        let p = proc_mut(st, lead)?;
        let gpu = p.pdd_by_user_id(a.gpu_id).ok_or(libc::EINVAL)?;
        if flags & alloc::PUBLIC != 0 && flags & alloc::VRAM != 0 && !st.devs.gpus[gpu].vram_public
        {
            // Host-visible VRAM is refused on small-BAR boards, before
            // the device is bound.
            return Err(libc::EINVAL);
        }
    }
    let gpu = bound_pdd(st, lead, a.gpu_id, libc::ENODEV)?;
    let user_addr = a.mmap_offset;
    if flags & alloc::TYPE_MASK == alloc::USERPTR {
        // The kernel pins (faults in) user pages at allocation time.
        let mut b = [0u8; 1];
        user_read(caller.tid, user_addr, &mut b)?;
    }
    let (key, offset) = create_bo(st, lead, gpu, a.va_addr, a.size, flags, user_addr, None)?;
    let p = proc_mut(st, lead)?;
    if matches!(
        flags & alloc::TYPE_MASK,
        alloc::DOORBELL | alloc::MMIO_REMAP
    ) {
        // The offset names the process' slot.
        p.slot_pinned = true;
    }
    a.handle = p.handle(key);
    a.mmap_offset = offset;
    Ok(())
}

pub fn free_memory(
    st: &mut State,
    lead: u32,
    a: &mut sys::kfd_ioctl_free_memory_of_gpu_args,
) -> R<()> {
    let p = proc_mut(st, lead)?;
    let key = p.key_of_handle(a.handle)?;
    if let Some(sp) = &p.signal_page {
        if sp.handle == Some(a.handle) {
            // KFD keeps the signal page BO until the process goes.
            return Err(libc::EPERM);
        }
    }
    let bo = p.bos.remove(&key).unwrap();
    st.free_bo_memory(key.gpu, &bo);
    Ok(())
}

/// MAP/UNMAP_MEMORY_TO_GPU: resumes at `n_success`, which reports how
/// far the device list got, as KFD does for partial failures.
pub fn map_memory(
    st: &mut State,
    lead: u32,
    caller: &Caller,
    a: &mut sys::kfd_ioctl_map_memory_to_gpu_args,
    map: bool,
) -> R<()> {
    let n = a.n_devices;
    let start = a.n_success;
    if n == 0 || start > n || n > 1024 {
        return Err(libc::EINVAL);
    }
    let mut raw = vec![0u8; n as usize * 4];
    user_read(caller.tid, a.device_ids_array_ptr, &mut raw)?;
    let p = proc_mut(st, lead)?;
    if map {
        // MAP binds the BO's own device first.
        let own = p
            .pdd_by_user_id((a.handle >> 32) as u32)
            .ok_or(libc::EINVAL)?;
        if p.pdds[own].vm.is_none() {
            return Err(libc::ENODEV);
        }
    }
    let key = bo_of_handle(p, a.handle)?;
    for i in start..n {
        let id: u32 = uapi::nth(&raw, i as usize);
        let gpu = p.pdd_by_user_id(id).ok_or(libc::EINVAL)?;
        if map && p.pdds[gpu].vm.is_none() {
            return Err(libc::ENODEV);
        }
        let mapped = p.bos.mapped_mut(&key).unwrap();
        let changed = if map {
            mapped.insert(gpu)
        } else {
            mapped.remove(&gpu)
        };
        if !changed && !map {
            return Err(libc::EINVAL);
        }
        a.n_success = i + 1;
    }
    Ok(())
}

pub fn available_memory(
    st: &mut State,
    lead: u32,
    a: &mut sys::kfd_ioctl_get_available_memory_args,
) -> R<()> {
    let p = proc_mut(st, lead)?;
    let gpu = p.pdd_by_user_id(a.gpu_id).ok_or(libc::EINVAL)?;
    let g = &st.devs.gpus[gpu];
    a.available = g.vram_size - st.gpu_alloc[gpu].vram_used;
    Ok(())
}

pub fn set_xnack(st: &mut State, lead: u32, a: &mut sys::kfd_ioctl_set_xnack_mode_args) -> R<()> {
    let p = proc_mut(st, lead)?;
    let v = a.xnack_enabled;
    if v < 0 {
        a.xnack_enabled = p.xnack as i32;
        return Ok(());
    }
    if !p.queues.is_empty() {
        // The kernel refuses to switch while queues exist.
        return Err(libc::EBUSY);
    }
    if p.xnack == (v != 0) && v <= 1 {
        return Ok(());
    }
    if v != 0 && !xnack_supported(&st.devs) {
        return Err(libc::EPERM);
    }
    proc_mut(st, lead)?.xnack = v != 0;
    Ok(())
}

/// `kfd_process_xnack_mode(p, true)`: whether every GPU can run the process
/// with XNACK (page-fault retry) on.  GPUs with per-process XNACK (gfx90a,
/// gfx94x) can; the others run with amdgpu's boot-time retry setting, whose
/// default for every GFX9 GPU of the profiles is off (`noretry=1`).
pub fn xnack_supported(devs: &super::state::Devices) -> bool {
    devs.gpus.iter().all(|g| g.per_process_xnack)
}

/// Queues a process may have on one GPU (KFD's HWS limit; GC 9.4.3 has
/// none, and KFD allows 255 there).
fn max_queues_per_pdd(g: &super::state::Gpu) -> usize {
    if g.gc_version() == (9, 4, 3) {
        255
    } else {
        127
    }
}

/// KFD's default `max_num_of_queues_per_device`.
const MAX_QUEUES_PER_DEVICE: usize = 4096;

/// Inserts a queue after checking the limits in KFD's order: the process'
/// queues on the GPU (ENOSPC), the queue id, every process' queues on the
/// GPU (EPERM), a free SDMA queue for SDMA queues (ENOMEM).  Compute
/// queues have no hardware limit: the HWS over-subscribes its HQDs.  Used
/// by CREATE_QUEUE and CRIU RESTORE.
pub fn add_queue(st: &mut State, lead: u32, id: u32, q: Queue) -> R<()> {
    let g = &st.devs.gpus[q.gpu];
    let p = st.procs.get(&lead).ok_or(libc::ESRCH)?;
    if p.queues.values().filter(|x| x.gpu == q.gpu).count() >= max_queues_per_pdd(g) {
        return Err(libc::ENOSPC);
    }
    if id >= uapi::MAX_QUEUES_PER_PROCESS || p.queues.contains_key(&id) {
        return Err(libc::EINVAL);
    }
    let on_gpu = st.queues_on(q.gpu, true) + st.queues_on(q.gpu, false);
    if on_gpu as usize >= MAX_QUEUES_PER_DEVICE {
        return Err(libc::EPERM);
    }
    if q.is_sdma() && st.queues_on(q.gpu, true) >= g.max_sdma_queues {
        return Err(libc::ENOMEM);
    }
    st.doorbells(lead, q.gpu)?;
    let p = proc_mut(st, lead)?;
    p.queues.insert(id, q);
    Ok(())
}

/// The KFD minor version from which a compute queue's save area sizes must
/// be the node's (Linux 6.12's `kfd_queue_acquire_buffers`).
const CWSR_SIZES_EXACT: u32 = 17;

/// A compute queue's context save area and control stack sizes (one XCC's),
/// at CREATE_QUEUE and RESTORE (`op`): the node's exactly from KFD 1.17 on,
/// as KFD checks them there; at most the node's before (libhsakmt computes
/// its own sizes, the same ones), as the save and restore of its waves
/// read and write that much; a control stack within its area.  A queue
/// without a save area never has its waves saved and is not checked.
/// EINVAL, logged naming the process, GPU and field.
pub fn check_cwsr_sizes(st: &State, lead: u32, q: &Queue, op: &str) -> R<()> {
    if q.is_sdma() || q.ctx_addr == 0 {
        return Ok(());
    }
    let g = &st.devs.gpus[q.gpu];
    let exact = st.devs.kfd_minor >= CWSR_SIZES_EXACT;
    let fits = |size: u32, node: u32| if exact { size == node } else { size <= node };
    let (field, size, node) = if !fits(q.ctl_stack_size, g.ctl_stack_size) {
        ("ctl_stack_size", q.ctl_stack_size, g.ctl_stack_size)
    } else if !fits(q.ctx_size, g.cwsr_size) {
        ("ctx_save_restore_size", q.ctx_size, g.cwsr_size)
    } else if q.ctl_stack_size > q.ctx_size {
        ("ctl_stack_size", q.ctl_stack_size, q.ctx_size)
    } else {
        return Ok(());
    };
    let rule = if exact { "is not" } else { "exceeds" };
    log::error!(
        "kfd-emu: process {lead} GPU {:#x}: {op} refused (EINVAL): the queue's {field} {size:#x} \
         {rule} the node's {node:#x}",
        g.id
    );
    Err(libc::EINVAL)
}

/// KFD_MIN_QUEUE_RING_SIZE: smaller rings (0 included) are raised to it.
const MIN_QUEUE_RING_SIZE: u32 = 1024;

/// ENOTSUPP (524): the kernel-internal errno KFD lets escape for an
/// unknown queue type.
pub const ENOTSUPP: i32 = 524;

/// CREATE_QUEUE (1.11 layout), checks in KFD's order; `engine` is KFD
/// 1.17's `sdma_engine_id` (None before).
pub fn create_queue(
    st: &mut State,
    lead: u32,
    a: &mut sys::kfd_ioctl_create_queue_args,
    engine: Option<u32>,
) -> R<()> {
    let by_engine = check_queue_args(a, engine)?;
    let qtype = a.queue_type;
    let gpu = bound_pdd(st, lead, a.gpu_id, libc::ESRCH)?;
    let sdma_id = sdma_id_for(st, gpu, qtype, engine.filter(|_| by_engine))?;
    let p = proc_mut(st, lead)?;
    let id = (0..uapi::MAX_QUEUES_PER_PROCESS)
        .find(|i| !p.queues.contains_key(i))
        .ok_or(libc::ENOMEM)?;
    let q = Queue {
        gpu,
        qtype,
        ring_base: a.ring_base_address,
        ring_size: a.ring_size,
        wptr_addr: a.write_pointer_address,
        rptr_addr: a.read_pointer_address,
        percent: a.queue_percentage,
        priority: a.queue_priority,
        eop_addr: a.eop_buffer_address,
        eop_size: a.eop_buffer_size,
        ctx_addr: a.ctx_save_restore_address,
        ctx_size: a.ctx_save_restore_size,
        ctl_stack_size: a.ctl_stack_size,
        doorbell_index: id,
        sdma_id,
        rptr: 0,
        halted: false,
        cu_mask: Vec::new(),
        aql: Default::default(),
        engine: Default::default(),
    };
    check_cwsr_sizes(st, lead, &q, "CREATE_QUEUE")?;
    add_queue(st, lead, id, q)?;
    let p = proc_mut(st, lead)?;
    // Fresh doorbell: wptr 0, so nothing runs before the first ring.  An
    // AQL queue's doorbell is written with the index of the packet just
    // made ready, 0 the first time: it starts from a value it never takes,
    // so the packet processor sees that first ring (see `aql`).
    let fresh = if qtype == queue_type::COMPUTE_AQL {
        u64::MAX
    } else {
        0
    };
    p.pdds[gpu]
        .doorbells
        .as_ref()
        .unwrap()
        .write_u64(id as u64 * 8, fresh);
    a.queue_id = id;
    a.doorbell_offset = p.doorbell_offset(gpu, id);
    p.slot_pinned = true;
    log_queue(p, id, a);
    Ok(())
}

/// The info line of a new queue: its kind, ring and context save area
/// (scripts/bench-hip.sh reads the area's place from it).
fn log_queue(p: &super::state::Proc, id: u32, a: &sys::kfd_ioctl_create_queue_args) {
    let kind = match a.queue_type {
        queue_type::COMPUTE | queue_type::COMPUTE_AQL => "compute",
        _ => "sdma",
    };
    log::info!(
        "kfd-emu: process {} GPU {:#x} queue {id} created: {kind}, a {}-byte ring, context save \
         area {:#x}, {} bytes",
        p.lead,
        a.gpu_id,
        a.ring_size,
        a.ctx_save_restore_address,
        a.ctx_save_restore_size
    );
}

/// CREATE_QUEUE's first checks, on the arguments alone: percentage and
/// priority, the ring (its size raised to KFD's least), a queue type KFD
/// knows (ENOTSUPP otherwise).  Returns whether an SDMA queue is made by
/// engine id.
fn check_queue_args(a: &mut sys::kfd_ioctl_create_queue_args, engine: Option<u32>) -> R<bool> {
    if a.queue_percentage > 100 || a.queue_priority > 15 {
        return Err(libc::EINVAL);
    }
    if a.ring_size != 0 && !a.ring_size.is_power_of_two() || !a.ring_base_address.is_multiple_of(4)
    {
        return Err(libc::EINVAL);
    }
    a.ring_size = a.ring_size.max(MIN_QUEUE_RING_SIZE);
    let qtype = a.queue_type;
    let by_engine = qtype == queue_type::SDMA_BY_ENG_ID && engine.is_some();
    if !by_engine
        && !matches!(
            qtype,
            queue_type::COMPUTE
                | queue_type::SDMA
                | queue_type::COMPUTE_AQL
                | queue_type::SDMA_XGMI
        )
    {
        return Err(ENOTSUPP);
    }
    Ok(by_engine)
}

/// The SDMA queue id of a new queue of `qtype` on GPU `gpu`: engine
/// `engine`'s first free one for a queue made by engine id, the next one
/// for SDMA queues, 0 for compute queues.
fn sdma_id_for(st: &State, gpu: usize, qtype: u32, engine: Option<u32>) -> R<u32> {
    let engines = st.devs.gpus[gpu].sdma_engines;
    Ok(match engine {
        Some(e) if e >= engines => return Err(libc::EINVAL),
        Some(e) => st.free_sdma_id_on(gpu, e, engines),
        None if qtype == queue_type::SDMA || qtype == queue_type::SDMA_XGMI => {
            st.queues_on(gpu, true)
        }
        None => 0,
    })
}

pub fn destroy_queue(
    st: &mut State,
    lead: u32,
    a: &mut sys::kfd_ioctl_destroy_queue_args,
) -> R<()> {
    let p = proc_mut(st, lead)?;
    let q = p.queues.remove(&a.queue_id).ok_or(libc::EINVAL)?;
    // A queue's GWS goes back to the GPU with it.
    let pdd = &mut p.pdds[q.gpu];
    if pdd.gws_queue == Some(a.queue_id) {
        pdd.gws_queue = None;
    }
    Ok(())
}

/// UPDATE_QUEUE. A compute queue it unmaps (a ring of size 0 or base 0, a
/// share of 0) while a dispatch runs on it is preempted as KFD's HWS
/// unmaps it, with wavefront save: the returned job names the dispatch
/// whose waves the shader engine must save into the queue's context save
/// area ([`update_queue_saved`] takes the outcome); the queue rebuilds
/// them when UPDATE_QUEUE maps it again.
pub fn update_queue(
    st: &mut State,
    lead: u32,
    a: &mut sys::kfd_ioctl_update_queue_args,
) -> R<Option<SaveJob>> {
    let devs = st.devs.clone();
    let p = st.procs.get_mut(&lead).ok_or(libc::ESRCH)?;
    if a.queue_percentage > 100 || a.queue_priority > 15 {
        return Err(libc::EINVAL);
    }
    let rs = a.ring_size;
    if rs != 0 && !rs.is_power_of_two() || !a.ring_base_address.is_multiple_of(4) {
        return Err(libc::EINVAL);
    }
    // An unknown queue is EFAULT here (pqm_update_queue_properties).
    let q = p.queues.get_mut(&a.queue_id).ok_or(libc::EFAULT)?;
    let was_mapped = q.is_mappable();
    q.ring_base = a.ring_base_address;
    q.ring_size = rs.max(MIN_QUEUE_RING_SIZE);
    q.percent = a.queue_percentage;
    q.priority = a.queue_priority;
    let preempt = was_mapped && !q.is_mappable() && q.aql.running;
    let q = &p.queues[&a.queue_id];
    if preempt && (q.ctx_addr == 0 || q.ctl_stack_size == 0) {
        log::info!(
            "kfd-emu: process {lead} AQL queue {}: unmapped by UPDATE_QUEUE with a kernel \
             dispatch in flight and no context save area: its waves drain",
            a.queue_id
        );
        return Ok(None);
    }
    let xccs = devs.gpus[q.gpu].num_xcc;
    Ok(preempt.then(|| aql::save_job(p, a.queue_id, q, xccs)))
}

/// UPDATE_QUEUE's end, under the state lock again: the waves of queue
/// `id`'s dispatch are saved (its control stack kept with its MQD until
/// the queue is mapped again), or the dispatch ended meanwhile. Waves that
/// cannot be saved (the save area is not in the GPU VM, too small) drain,
/// as the CP finishes a dispatch it cannot preempt; the daemon says so.
pub fn update_queue_saved(st: &mut State, lead: u32, id: u32, outcome: Saved) {
    let Some(p) = st.procs.get_mut(&lead) else {
        return;
    };
    let user_ids: Vec<u32> = p.pdds.iter().map(|d| d.user_id).collect();
    let Some(q) = p.queues.get_mut(&id) else {
        return;
    };
    match outcome {
        Saved::Idle => {}
        Saved::Stack(stacks) => aql::keep_saved(q, stacks),
        Saved::Failed(why) => log::warn!(
            "kfd-emu: process {lead} GPU {:#x} AQL queue {id}: unmapped by UPDATE_QUEUE, but \
             the waves of its kernel dispatch cannot be saved into its context save area at \
             {:#x}: {why}; they drain",
            user_ids[q.gpu],
            q.ctx_addr
        ),
    }
}

/// Attaches the signal page: the BO named by `handle`, or (handle 0) the
/// process' events range of the /dev/kfd memfd.
pub fn attach_signal_page(st: &mut State, lead: u32, handle: u64) -> R<()> {
    let devs = st.devs.clone();
    let p = proc_mut(st, lead)?;
    if p.signal_page.is_some() {
        return Ok(());
    }
    let page = if handle != 0 {
        let key = p.key_of_handle(handle)?;
        let bo = &p.bos[&key];
        let map = bo.map.clone().ok_or(libc::EINVAL)?;
        if map.len() < uapi::PAGE {
            return Err(libc::EINVAL);
        }
        SignalPage {
            map,
            handle: Some(handle),
        }
    } else {
        let off = kfd_off::encode(kfd_off::EVENTS, p.slot, 0, 0);
        SignalPage {
            map: Arc::new(devs.kfd.map(off, uapi::SIGNAL_PAGE_SIZE)?),
            handle: None,
        }
    };
    let slots = (page.map.len() / 8).min(uapi::SIGNAL_EVENT_LIMIT as u64);
    for i in 0..slots {
        page.map.write_u64(i * 8, uapi::UNSIGNALED_SLOT);
    }
    p.signal_page = Some(page);
    Ok(())
}

pub fn signal_slots(p: &super::state::Proc) -> u32 {
    p.signal_page.as_ref().map_or(0, |s| {
        (s.map.len() / 8).min(uapi::SIGNAL_EVENT_LIMIT as u64) as u32
    })
}

/// CREATE_EVENT.  A non-zero `event_page_offset` on input is the handle
/// of the dGPU signal page BO, which KFD takes whatever the event type
/// (the thunk passes it with its first CREATE_EVENT, whichever event that
/// is); a second page is EINVAL.  Signal events without one get the
/// process' events range of /dev/kfd.  On output `event_page_offset` is
/// the events mmap offset for signal events and 0 for others.
pub fn create_event(st: &mut State, lead: u32, a: &mut sys::kfd_ioctl_create_event_args) -> R<()> {
    let etype = a.event_type;
    if a.event_page_offset != 0 {
        if proc_mut(st, lead)?.signal_page.is_some() {
            // kfd_kmap_event_page: "Event page is already set".
            return Err(libc::EINVAL);
        }
        attach_signal_page(st, lead, a.event_page_offset)?;
    }
    if etype > event_type::LAST {
        return Err(libc::EINVAL);
    }
    let signal = etype == event_type::SIGNAL || etype == event_type::DEBUG;
    if signal && proc_mut(st, lead)?.signal_page.is_none() {
        attach_signal_page(st, lead, 0)?;
    }
    let p = proc_mut(st, lead)?;
    let id = if signal {
        // KFD keeps event id 0 (slot 0) for itself: the interrupt handler's
        // fast path for interrupts without a context id.
        let n = signal_slots(p);
        (1..n)
            .find(|i| !p.events.contains_key(i))
            .ok_or(libc::ENOSPC)?
    } else {
        (uapi::FIRST_NONSIGNAL_EVENT_ID..=u32::MAX)
            .find(|i| !p.events.contains_key(i))
            .ok_or(libc::ENOSPC)?
    };
    p.events.insert(
        id,
        Event {
            etype,
            auto_reset: a.auto_reset != 0,
            signaled: false,
            node_id: a.node_id,
            trigger_data: a.event_trigger_data,
            exception: MemoryException::None,
            age: super::state::FIRST_EVENT_AGE,
        },
    );
    a.event_id = id;
    a.event_trigger_data = id;
    a.event_page_offset = 0;
    if signal {
        a.event_slot_index = id;
        a.event_page_offset = kfd_off::encode(kfd_off::EVENTS, p.slot, 0, 0);
        p.slot_pinned = true;
    }
    Ok(())
}

pub fn destroy_event(st: &mut State, lead: u32, id: u32, done: &mut Done) -> R<()> {
    let p = proc_mut(st, lead)?;
    p.events.remove(&id).ok_or(libc::EINVAL)?;
    // Waiters on a destroyed event are woken with failure by KFD; we
    // answer them EINVAL-free with a completed wait only if others fire.
    let mut i = 0;
    while i < p.waiters.len() {
        if p.waiters[i].events.iter().any(|e| e.0 == id) {
            let w = p.waiters.swap_remove(i);
            done.push(w.finish(Ok(WaitEnd::Fail)));
        } else {
            i += 1;
        }
    }
    Ok(())
}

pub fn set_event(st: &mut State, lead: u32, id: u32, done: &mut Done) -> R<()> {
    let p = proc_mut(st, lead)?;
    match p.events.get(&id) {
        Some(e) if e.etype == event_type::SIGNAL => {}
        _ => return Err(libc::EINVAL),
    }
    p.signal(id, done);
    Ok(())
}

pub fn reset_event(st: &mut State, lead: u32, id: u32) -> R<()> {
    let p = proc_mut(st, lead)?;
    let ev = p.events.get_mut(&id).ok_or(libc::EINVAL)?;
    ev.signaled = false;
    Ok(())
}

/// WAIT_EVENTS over an array of `kfd_event_data`.
/// Answers now, or parks `reply` and returns None.
/// A memory event's exception data as KFD reports it
/// (`kfd_hsa_memory_exception_data`).
pub fn memory_exception(e: &MemoryException) -> [u8; 32] {
    let data = match *e {
        MemoryException::None => return [0; 32],
        MemoryException::Saved(b) => return b,
        MemoryException::NotPresent { page, gpu_id } => sys::kfd_hsa_memory_exception_data {
            failure: sys::kfd_memory_exception_failure {
                NotPresent: 1,
                ..Default::default()
            },
            va: page,
            gpu_id,
            ErrorType: 0,
        },
    };
    uapi::bytes(&data)
        .try_into()
        .expect("kfd_hsa_memory_exception_data is 32 bytes")
}

/// WAIT_EVENTS' answer, encoded when the wait ends.
struct WaitEventsReply {
    reply: Box<dyn Replier>,
    tid: u32,
    args: sys::kfd_ioctl_wait_events_args,
    out_size: usize,
}

impl WaitReply for WaitEventsReply {
    fn answer(mut self: Box<Self>, end: R<WaitEnd>) -> Answer {
        let result = match end {
            Err(e) => return (self.reply, Err(e)),
            Ok(WaitEnd::Timeout) => uapi::WAIT_TIMEOUT,
            Ok(WaitEnd::Fail) => uapi::WAIT_FAIL,
            Ok(WaitEnd::Complete(fired)) => {
                // copy_signaled_event_data: each fired memory event's
                // exception data into the caller's kfd_event_data array;
                // EFAULT when it cannot be written.
                let stride = size_of::<sys::kfd_event_data>() as u64;
                for (i, f) in fired {
                    let at = self.args.events_ptr + i as u64 * stride;
                    let data = match f {
                        Fired::Memory(e) => memory_exception(&e).to_vec(),
                        // signal_event_data.last_event_age, at the union's start.
                        Fired::Age(age) => age.to_le_bytes().to_vec(),
                    };
                    if user_write(self.tid, at, &data).is_err() {
                        return (self.reply, Err(libc::EFAULT));
                    }
                }
                uapi::WAIT_COMPLETE
            }
        };
        self.args.wait_result = result;
        (self.reply, Ok(uapi::encode(&self.args, self.out_size)))
    }

    fn request_id(&self) -> Option<u64> {
        self.reply.request_id()
    }
}

/// The `signal_event_data.last_event_age` of the caller's `i`th
/// kfd_event_data (the union's first 8 bytes).
fn last_event_age(raw: &[u8], i: usize) -> u64 {
    let at = i * size_of::<sys::kfd_event_data>();
    u64::from_le_bytes(raw[at..at + 8].try_into().unwrap())
}

pub fn wait_events(
    st: &mut State,
    kfd_minor: u32,
    lead: u32,
    caller: &Caller,
    a: sys::kfd_ioctl_wait_events_args,
    out_size: usize,
    reply: Box<dyn Replier>,
) -> Option<Answer> {
    let n = a.num_events as usize;
    if n == 0 || n > uapi::SIGNAL_EVENT_LIMIT as usize * 2 {
        return Some((reply, Err(libc::EINVAL)));
    }
    let mut raw = vec![0u8; n * size_of::<sys::kfd_event_data>()];
    if let Err(e) = user_read(caller.tid, a.events_ptr, &mut raw) {
        return Some((reply, Err(e)));
    }
    let Ok(p) = proc_mut(st, lead) else {
        return Some((reply, Err(libc::ESRCH)));
    };
    let ids: Vec<u32> = (0..n)
        .map(|i| uapi::nth::<sys::kfd_event_data>(&raw, i).event_id)
        .collect();
    if ids.iter().any(|id| !p.events.contains_key(id)) {
        return Some((reply, Err(libc::EINVAL)));
    }
    let mut events = Vec::with_capacity(n);
    let mut aged = Vec::with_capacity(n);
    for (i, id) in ids.into_iter().enumerate() {
        let ev = p.events.get_mut(&id).unwrap();
        let mut active = ev.signaled;
        ev.signaled = ev.signaled && !ev.auto_reset;
        // init_event_waiter (KFD 1.14): a signal event whose age differs
        // from the caller's last one has fired since; age 0 is "none".
        let last = last_event_age(&raw, i);
        let age = kfd_minor >= 14 && ev.etype == event_type::SIGNAL && last != 0;
        if age && ev.age != last {
            active = true;
        }
        events.push((id, active));
        aged.push(age);
    }
    let timeout = a.timeout;
    let deadline = (timeout != uapi::TIMEOUT_INFINITE)
        .then(|| Instant::now() + Duration::from_millis(timeout as u64));
    let w = Waiter {
        tid: caller.tid,
        events,
        aged,
        all: a.wait_for_all != 0,
        deadline,
        reply: Box::new(WaitEventsReply {
            reply,
            tid: caller.tid,
            args: a,
            out_size,
        }),
    };
    let ready = if w.all {
        w.events.iter().all(|e| e.1)
    } else {
        w.events.iter().any(|e| e.1)
    };
    if ready {
        return Some(w.complete(&p.events));
    }
    if timeout == 0 {
        return Some(w.finish(Ok(WaitEnd::Timeout)));
    }
    // A thread is in one ioctl at a time, and an interrupted wait leaves
    // at once (`Emulator::interrupt`): an older wait of this thread can
    // only be one whose interrupt never reached the model.  Drop it (its
    // reply answers EIO, unseen by the caller) rather than let it take a
    // later event.
    p.waiters.retain(|o| o.tid != caller.tid);
    p.waiters.push(w);
    None
}

/// SET_MEMORY_POLICY: KFD's checks, in its order; the policy is recorded
/// on the pdd (cache policies have no effect on the emulated GPU).
pub fn set_memory_policy(
    st: &mut State,
    lead: u32,
    a: &mut sys::kfd_ioctl_set_memory_policy_args,
) -> R<()> {
    // KFD_IOC_CACHE_POLICY_COHERENT (0) or _NONCOHERENT (1).
    if a.default_policy > 1 || a.alternate_policy > 1 {
        return Err(libc::EINVAL);
    }
    let gpu = bound_pdd(st, lead, a.gpu_id, libc::ESRCH)?;
    // APE1: base and limit in 64 KiB units below 2^47 (its low 16 bits
    // are 0000/FFFF in hardware); size 0 disables it (base > limit).
    let (base, size) = (a.alternate_aperture_base, a.alternate_aperture_size);
    const FIXED: u64 = 0xFFFF_8000_0000_FFFF;
    let (ape1_base, ape1_limit) = if size == 0 {
        (1, 0)
    } else {
        let limit = base.wrapping_add(size).wrapping_sub(1);
        if limit <= base || base & FIXED != 0 || limit & FIXED != 0xFFFF {
            return Err(libc::EINVAL);
        }
        (base >> 16, limit >> 16)
    };
    proc_mut(st, lead)?.pdds[gpu].mem_policy = Some(super::state::MemPolicy {
        default: a.default_policy,
        alternate: a.alternate_policy,
        ape1_base,
        ape1_limit,
    });
    Ok(())
}

fn clock_ns(clk: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the local timespec.
    unsafe { libc::clock_gettime(clk, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// GET_CLOCK_COUNTERS: the emulated GPU clock is CLOCK_MONOTONIC_RAW in ns.
/// A gpu_id the process has no device for (a CPU node's 0) gets a GPU
/// counter of 0, as KFD answers for a node without GPU.
pub fn clock_counters(
    st: &mut State,
    lead: u32,
    a: &mut sys::kfd_ioctl_get_clock_counters_args,
) -> R<()> {
    let p = proc_mut(st, lead)?;
    let gpu = p.pdd_by_user_id(a.gpu_id);
    let raw = super::asic::gpu_clock_counter();
    a.gpu_clock_counter = if gpu.is_some() { raw } else { 0 };
    a.cpu_clock_counter = raw;
    a.system_clock_counter = clock_ns(libc::CLOCK_BOOTTIME);
    a.system_clock_freq = 1_000_000_000;
    Ok(())
}

/// GET_PROCESS_APERTURES (the old fixed-array form): at most
/// NUM_OF_SUPPORTED_GPUS (7) devices.
pub fn apertures_old(
    st: &mut State,
    lead: u32,
    a: &mut sys::kfd_ioctl_get_process_apertures_args,
) -> R<()> {
    let p = proc_mut(st, lead)?;
    a.num_of_nodes = 0;
    for (slot, pdd) in a.process_apertures.iter_mut().zip(&p.pdds) {
        *slot = aperture(pdd.user_id);
        a.num_of_nodes += 1;
    }
    Ok(())
}

/// The apertures KFD gives a GFX9 dGPU process device.
fn aperture(gpu_id: u32) -> sys::kfd_process_device_apertures {
    sys::kfd_process_device_apertures {
        lds_base: uapi::LDS_BASE,
        lds_limit: uapi::LDS_BASE | 0xffff_ffff,
        scratch_base: uapi::SCRATCH_BASE,
        scratch_limit: uapi::SCRATCH_BASE | 0xffff_ffff,
        gpuvm_base: uapi::GPUVM_BASE,
        gpuvm_limit: uapi::GPUVM_LIMIT,
        gpu_id,
        pad: 0,
    }
}

/// SET_SCRATCH_BACKING_VA: records SH_HIDDEN_PRIVATE_BASE on the pdd.  An
/// unbound device fails the bind (ENODEV).
pub fn set_scratch_backing_va(
    st: &mut State,
    lead: u32,
    a: &mut sys::kfd_ioctl_set_scratch_backing_va_args,
) -> R<()> {
    let gpu = bound_pdd(st, lead, a.gpu_id, libc::ENODEV)?;
    proc_mut(st, lead)?.pdds[gpu].scratch_va = Some(a.va_addr);
    Ok(())
}

/// SET_TRAP_HANDLER: records the trap handler on the pdd.  KFD binds its
/// own CWSR trap handler on dGPUs, so this is the second level it jumps
/// to.  Any bind failure is ESRCH here.
pub fn set_trap_handler(
    st: &mut State,
    lead: u32,
    a: &mut sys::kfd_ioctl_set_trap_handler_args,
) -> R<()> {
    let gpu = bound_pdd(st, lead, a.gpu_id, libc::ESRCH)?;
    proc_mut(st, lead)?.pdds[gpu].trap = Some((a.tba_addr, a.tma_addr));
    Ok(())
}

/// GB_ADDR_CONFIG of a GPU: the value amdgpu programs (the one the
/// render node's READ_MMR_REG reads too, see `asic`).
pub fn gb_addr_config(g: &super::state::Gpu) -> u32 {
    g.asic.gb_addr_config
}

/// GET_TILE_CONFIG: GFX9 and later have no tile mode tables: amdgpu keeps
/// 32 tile and 16 macro tile entries, all 0, and no bank/rank counts.
/// Each table is copied up to the caller's count, which is clipped to it.
pub fn get_tile_config(
    st: &mut State,
    lead: u32,
    caller: &Caller,
    a: &mut sys::kfd_ioctl_get_tile_config_args,
) -> R<()> {
    let p = proc_mut(st, lead)?;
    let gpu = p.pdd_by_user_id(a.gpu_id).ok_or(libc::EINVAL)?;
    a.gb_addr_config = gb_addr_config(&st.devs.gpus[gpu]);
    a.num_banks = 0;
    a.num_ranks = 0;
    a.num_tile_configs = a.num_tile_configs.min(32);
    let n = a.num_tile_configs as usize * 4;
    if n > 0 && user_write(caller.tid, a.tile_config_ptr, &vec![0; n]).is_err() {
        a.num_tile_configs = 0;
        return Err(libc::EFAULT);
    }
    a.num_macro_tile_configs = a.num_macro_tile_configs.min(16);
    let n = a.num_macro_tile_configs as usize * 4;
    if n > 0 && user_write(caller.tid, a.macro_tile_config_ptr, &vec![0; n]).is_err() {
        a.num_macro_tile_configs = 0;
        return Err(libc::EFAULT);
    }
    Ok(())
}

/// Whether KFD counts queue `q` as active (mapped by the scheduler): a
/// ring, a non-zero share and a process not evicted.
fn queue_active(p: &super::state::Proc, q: &Queue) -> bool {
    q.is_mappable() && !p.evicted()
}

/// SET_CU_MASK: KFD's checks; the mask is recorded on the queue.
pub fn set_cu_mask(
    st: &mut State,
    lead: u32,
    caller: &Caller,
    a: &mut sys::kfd_ioctl_set_cu_mask_args,
) -> R<()> {
    let n = a.num_cu_mask;
    if !n.is_multiple_of(32) || n == 0 {
        return Err(libc::EINVAL);
    }
    // Bits past 1024 are dropped.
    let n = n.min(1024);
    let mut raw = vec![0u8; n as usize / 8];
    user_read(caller.tid, a.cu_mask_ptr, &mut raw).map_err(|_| libc::EFAULT)?;
    let mask: Vec<u32> = (0..raw.len() / 4).map(|i| uapi::nth(&raw, i)).collect();
    let devs = st.devs.clone();
    let p = proc_mut(st, lead)?;
    let q = p.queues.get_mut(&a.queue_id).ok_or(libc::EFAULT)?;
    if devs.gpus[q.gpu].gc_version().0 >= 10 {
        // WGP parts: CUs are enabled in pairs.
        for i in (0..n as usize).step_by(2) {
            let pair = (mask[i / 32] >> (i % 32)) & 3;
            if pair != 0 && pair != 3 {
                return Err(libc::EINVAL);
            }
        }
    }
    q.cu_mask = mask;
    Ok(())
}

/// GET_QUEUE_WAVE_STATE (KFD's `get_wave_state`): the saved waves of a
/// compute queue that is not active (an eviction or UPDATE_QUEUE unmapped
/// it; CRIU's PROCESS_INFO saved its dispatch in flight) on a GPU with
/// CWSR. For each XCC `x` the MQD's view goes to `ctl_stack_address` plus
/// `x` per-XCC save area sizes: the header's four `wave_state` fields at 0
/// and the control stack where it lies in the area. The sizes returned
/// are XCC 0's, as KFD's v9.4.3 path does. An unknown queue is EFAULT, an
/// SDMA or active queue EINVAL; the queue runs on when it is active again.
pub fn get_queue_wave_state(
    st: &mut State,
    lead: u32,
    caller: &Caller,
    a: &mut sys::kfd_ioctl_get_queue_wave_state_args,
) -> R<()> {
    let devs = st.devs.clone();
    let p = proc_mut(st, lead)?;
    let q = p.queues.get(&a.queue_id).ok_or(libc::EFAULT)?;
    let g = &devs.gpus[q.gpu];
    if q.is_sdma() || queue_active(p, q) || g.cwsr_size == 0 {
        return Err(libc::EINVAL);
    }
    for x in 0..g.num_xcc.max(1) {
        let (header, stack) =
            mqd_wave_state(q, x as usize, super::shader_target(g)).map_err(|why| {
                log::error!(
                    "kfd-emu: process {lead} GPU {:#x} AQL queue {}: GET_QUEUE_WAVE_STATE \
                     cannot read the saved control stack of XCC {x}: {why} (EINVAL)",
                    p.pdds[q.gpu].user_id,
                    a.queue_id
                );
                libc::EINVAL
            })?;
        let at = a.ctl_stack_address + u64::from(x) * u64::from(q.ctx_size);
        let stack_at = at + u64::from(header.control_stack_offset);
        let mut bytes = [0u8; 16];
        header.write_wave_state(&mut bytes);
        user_write(caller.tid, at, &bytes).map_err(|_| libc::EFAULT)?;
        user_write(caller.tid, stack_at, stack).map_err(|_| libc::EFAULT)?;
        if x == 0 {
            a.ctl_stack_used_size = header.control_stack_size;
            a.save_area_used_size = header.wave_state_size;
        }
    }
    Ok(())
}

/// XCC `x`'s MQD fields KFD reports for queue `q` (CP_HQD_CNTL_STACK_SIZE
/// and _OFFSET, CP_HQD_WG_STATE_OFFSET, as `wave_state` header fields) and
/// its control stack. Without a save area they stay 0, as KFD's MQD does;
/// without saved waves the control stack and the wave area are empty.
fn mqd_wave_state(
    q: &Queue,
    x: usize,
    target: Option<gfx9::Target>,
) -> Result<(gfx9::cwsr::Header, &[u8]), String> {
    if q.ctx_addr == 0 {
        return Ok((gfx9::cwsr::Header::default(), &[]));
    }
    let stack = q.aql.saved.get(x).map_or(&[][..], Vec::as_slice);
    let ctl = q.ctl_stack_size;
    let used = match (stack.is_empty(), target) {
        (true, _) => 0,
        (false, Some(t)) => gfx9::cwsr::ControlStack::decode(t, stack)
            .map(|s| s.wave_area_used() as u32)
            .map_err(|e| e.to_string())?,
        (false, None) => return Err("the GPU runs no shaders".into()),
    };
    let header = gfx9::cwsr::Header {
        control_stack_offset: ctl - stack.len() as u32,
        control_stack_size: stack.len() as u32,
        wave_state_offset: ctl + used,
        wave_state_size: used,
        ..Default::default()
    };
    Ok((header, stack))
}

/// ALLOC_QUEUE_GWS: binds (num_gws != 0) or releases the GPU's global wave
/// sync for a queue; one queue per process and GPU may hold it.
pub fn alloc_queue_gws(
    st: &mut State,
    lead: u32,
    a: &mut sys::kfd_ioctl_alloc_queue_gws_args,
) -> R<()> {
    let devs = st.devs.clone();
    let p = proc_mut(st, lead)?;
    let gpu = p.queues.get(&a.queue_id).ok_or(libc::EINVAL)?.gpu;
    if devs.gpus[gpu].num_gws == 0 {
        return Err(libc::ENODEV);
    }
    set_gws(p, a.queue_id, gpu, a.num_gws != 0)?;
    a.first_gws = 0;
    Ok(())
}

/// `pqm_set_gws`: shared by ALLOC_QUEUE_GWS and CRIU RESTORE.
pub fn set_gws(p: &mut super::state::Proc, queue: u32, gpu: usize, on: bool) -> R<()> {
    let pdd = &mut p.pdds[gpu];
    match (on, pdd.gws_queue) {
        (true, Some(_)) => Err(libc::EBUSY),
        (false, None) => Err(libc::EINVAL),
        (true, None) => {
            pdd.gws_queue = Some(queue);
            Ok(())
        }
        (false, Some(_)) => {
            pdd.gws_queue = None;
            Ok(())
        }
    }
}

/// The dma-buf GET_DMABUF_INFO and IMPORT_DMABUF name: one of the
/// emulator's (`own`: KFD's EXPORT_DMABUF, a GEM BO's PRIME export, a
/// CRIU op's); EBADF for a closed fd (dma_buf_get), EINVAL for any other
/// file, as KFD answers for a file that is no dma-buf or not amdgpu's.
pub fn dmabuf_arg<'a>(
    res: &dyn FdResolver,
    own: Option<&'a Dmabuf>,
    caller: &Caller,
    fd: u32,
) -> R<&'a Dmabuf> {
    if let Some(d) = own {
        return Ok(d);
    }
    match res.open_of(caller.tgid, fd as i32) {
        Err(libc::EBADF) => Err(libc::EBADF),
        _ => Err(libc::EINVAL),
    }
}

/// The KFD allocation flags of a dma-buf's BO, as
/// `amdgpu_amdkfd_get_dmabuf_info` and the import give them: VRAM or GTT
/// by the BO's preferred domain (the PUBLIC bit of CPU-visible VRAM is not
/// kept with the emulator's dma-bufs).
fn dmabuf_flags(d: &Dmabuf) -> u32 {
    if d.source.domain == sys::AMDGPU_GEM_DOMAIN_VRAM {
        alloc::VRAM
    } else {
        alloc::GTT
    }
}

/// GET_DMABUF_INFO: the BO's size, GPU (the caller's id of it) and
/// flags; no metadata (the emulator keeps none with KFD BOs).
pub fn get_dmabuf_info(
    st: &mut State,
    lead: u32,
    d: &Dmabuf,
    a: &mut sys::kfd_ioctl_get_dmabuf_info_args,
) -> R<()> {
    let p = proc_mut(st, lead)?;
    a.gpu_id = p.pdds.get(d.source.gpu).ok_or(libc::EINVAL)?.user_id;
    a.size = d.size;
    a.flags = dmabuf_flags(d);
    a.metadata_size = 0;
    Ok(())
}

/// IMPORT_DMABUF (`kfd_ioctl_import_dmabuf`): a BO of the caller at
/// `va_addr` on its GPU `gpu_id` whose memory is the dma-buf's BO (its
/// mmap offset too, as KFD's CHECKPOINT reports an import), writable and
/// executable.  EINVAL for a GPU the process lacks, ENODEV before
/// ACQUIRE_VM; an import into another GPU than the BO's (a new GTT BO of
/// the dma-buf's pages on KFD) is not modelled: EOPNOTSUPP.
pub fn import_dmabuf(
    st: &mut State,
    lead: u32,
    d: &Dmabuf,
    a: &mut sys::kfd_ioctl_import_dmabuf_args,
) -> R<()> {
    let gpu = bound_pdd(st, lead, a.gpu_id, libc::ENODEV)?;
    if gpu != d.source.gpu {
        log::warn!(
            "kfd-emu: AMDKFD_IOC_IMPORT_DMABUF from process {lead}: a dma-buf of GPU index {} \
             imported on GPU index {gpu} is not modelled",
            d.source.gpu
        );
        return Err(libc::EOPNOTSUPP);
    }
    let flags = dmabuf_flags(d) | alloc::WRITABLE | alloc::EXECUTABLE;
    let size = checked_bo_range(a.va_addr, d.size, flags & alloc::TYPE_MASK)?;
    let p = proc_mut(st, lead)?;
    if p.bos.va_taken(a.va_addr, size) {
        return Err(libc::EINVAL);
    }
    let idr = bo_idr(p, gpu, None)?;
    let bo = Bo {
        va: a.va_addr,
        size,
        flags,
        offset: d.source.offset,
        user_addr: 0,
        map: Some(d.map.clone()),
        mapped: BTreeSet::new(),
        imported: true,
    };
    let key = insert_bo(p, gpu, idr, bo);
    a.handle = p.handle(key);
    Ok(())
}

/// SMI_EVENTS: KFD answers a new anonymous fd, which an ioctl served over
/// FUSE cannot install in the caller: a known gap (see README).  An
/// unknown GPU is EINVAL as on KFD.
pub fn smi_events(st: &mut State, lead: u32, a: &mut sys::kfd_ioctl_smi_events_args) -> R<()> {
    let p = proc_mut(st, lead)?;
    p.pdd_by_user_id(a.gpuid).ok_or(libc::EINVAL)?;
    log::warn!(
        "kfd-emu: AMDKFD_IOC_SMI_EVENTS from process {lead}: SMI event fds are not emulated"
    );
    Err(libc::EOPNOTSUPP)
}
