//! /dev/kfd ioctls (except CRIU_OP, see `criu`): decode the argument
//! struct, act on the fd's process, encode the answer.

use std::collections::BTreeSet;
use std::mem::size_of;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::mem::{user_read, user_write};
use super::state::{Answer, Bo, BoKey, Done, Event, Queue, SignalPage, State, Waiter, R};
use super::uapi::{self, alloc, event_type, kfd_off, queue_type, sys};
use super::{Caller, FdResolver, Replier};

fn proc_mut(st: &mut State, lead: u32) -> R<&mut super::state::Proc> {
    st.procs.get_mut(&lead).ok_or(libc::ESRCH)
}

pub fn get_version(a: &mut sys::kfd_ioctl_get_version_args) -> R<()> {
    a.major_version = uapi::KFD_MAJOR;
    a.minor_version = uapi::KFD_MINOR;
    Ok(())
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
        a.num_of_nodes = p.pdds.len() as u32;
        return Ok(());
    }
    let n = (n as usize).min(p.pdds.len());
    let mut out = Vec::new();
    for pdd in p.pdds.iter().take(n) {
        let ap = sys::kfd_process_device_apertures {
            lds_base: uapi::LDS_BASE,
            lds_limit: uapi::LDS_BASE | 0xffff_ffff,
            scratch_base: uapi::SCRATCH_BASE,
            scratch_limit: uapi::SCRATCH_BASE | 0xffff_ffff,
            gpuvm_base: uapi::GPUVM_BASE,
            gpuvm_limit: uapi::GPUVM_LIMIT,
            gpu_id: pdd.user_id,
            pad: 0,
        };
        uapi::push(&mut out, &ap);
    }
    user_write(caller.tid, a.kfd_process_device_apertures_ptr, &out)?;
    a.num_of_nodes = n as u32;
    Ok(())
}

/// Binds pdd `gpu` to the render-node open `fh` (ACQUIRE_VM, and the
/// equivalent step of CRIU RESTORE).
pub fn bind_vm(st: &mut State, lead: u32, gpu: usize, fh: u64) -> R<()> {
    match st.opens.get(&fh) {
        Some(super::state::Open::Render { gpu: g }) if *g == gpu => {}
        _ => return Err(libc::EINVAL),
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

fn bound_pdd(st: &mut State, lead: u32, user_gpu: u32) -> R<usize> {
    let p = proc_mut(st, lead)?;
    let gpu = p.pdd_by_user_id(user_gpu).ok_or(libc::EINVAL)?;
    if p.pdds[gpu].vm.is_none() {
        return Err(libc::EINVAL);
    }
    Ok(gpu)
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
    let p = proc_mut(st, lead)?;
    if p.bos
        .values()
        .any(|b| b.va < va + size && va < b.va + b.size)
    {
        return Err(libc::EINVAL);
    }
    let idr = match idr {
        Some(i) if p.bos.contains_key(&BoKey { gpu, idr: i }) => return Err(libc::ENOMEM),
        Some(i) => i,
        None => {
            let mut i = p.pdds[gpu].next_idr;
            while p.bos.contains_key(&BoKey { gpu, idr: i }) {
                i += 1;
            }
            i
        }
    };
    let slot = p.slot;
    let (offset, map) = match mem_type {
        alloc::VRAM | alloc::GTT => {
            if mem_type == alloc::VRAM
                && flags & alloc::PUBLIC != 0
                && !st.devs.gpus[gpu].vram_public
            {
                // Host-visible VRAM is refused on small-BAR boards.
                return Err(libc::EINVAL);
            }
            let (off, m) = st.reserve(gpu, mem_type, size)?;
            (off, Some(m))
        }
        alloc::USERPTR => {
            if !user_addr.is_multiple_of(uapi::PAGE) {
                return Err(libc::EINVAL);
            }
            (user_addr, None)
        }
        alloc::DOORBELL => {
            if size != uapi::DOORBELL_SLICE {
                return Err(libc::EINVAL);
            }
            (kfd_off::encode(kfd_off::DOORBELL, slot, gpu, 0), None)
        }
        alloc::MMIO_REMAP => {
            if size != uapi::PAGE {
                return Err(libc::EINVAL);
            }
            (kfd_off::encode(kfd_off::MMIO, slot, gpu, 0), None)
        }
        _ => return Err(libc::EINVAL),
    };
    let p = proc_mut(st, lead)?;
    let key = BoKey { gpu, idr };
    p.bos.insert(
        key,
        Bo {
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
        },
    );
    p.pdds[gpu].next_idr = p.pdds[gpu].next_idr.max(idr + 1);
    Ok((key, offset))
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
    let gpu = bound_pdd(st, lead, a.gpu_id)?;
    let flags = a.flags;
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
            return Err(libc::EBUSY);
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
    let key = p.key_of_handle(a.handle)?;
    for i in start..n {
        let id: u32 = uapi::nth(&raw, i as usize);
        let gpu = p.pdd_by_user_id(id).ok_or(libc::EINVAL)?;
        if p.pdds[gpu].vm.is_none() {
            return Err(libc::EINVAL);
        }
        let bo = p.bos.get_mut(&key).unwrap();
        let changed = if map {
            bo.mapped.insert(gpu)
        } else {
            bo.mapped.remove(&gpu)
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
    p.xnack = v != 0;
    Ok(())
}

/// Inserts a queue after checking the per-GPU limits; used by CREATE_QUEUE
/// and CRIU RESTORE.
pub fn add_queue(st: &mut State, lead: u32, id: u32, q: Queue) -> R<()> {
    let g = &st.devs.gpus[q.gpu];
    let (used, max) = if q.is_sdma() {
        (st.queues_on(q.gpu, true), g.max_sdma_queues)
    } else {
        (st.queues_on(q.gpu, false), g.max_cp_queues)
    };
    if used >= max {
        return Err(libc::ENOMEM);
    }
    st.doorbells(lead, q.gpu)?;
    let p = proc_mut(st, lead)?;
    if id >= uapi::MAX_QUEUES_PER_PROCESS || p.queues.contains_key(&id) {
        return Err(libc::EINVAL);
    }
    p.queues.insert(id, q);
    Ok(())
}

/// CREATE_QUEUE (1.11 layout).
pub fn create_queue(st: &mut State, lead: u32, a: &mut sys::kfd_ioctl_create_queue_args) -> R<()> {
    let gpu = bound_pdd(st, lead, a.gpu_id)?;
    let qtype = a.queue_type;
    let ring_size = a.ring_size;
    if !matches!(
        qtype,
        queue_type::COMPUTE | queue_type::SDMA | queue_type::COMPUTE_AQL | queue_type::SDMA_XGMI
    ) {
        return Err(libc::EINVAL);
    }
    if a.queue_percentage > 100 || a.queue_priority > 15 {
        return Err(libc::EINVAL);
    }
    if ring_size != 0 && !ring_size.is_power_of_two() || !a.ring_base_address.is_multiple_of(4) {
        return Err(libc::EINVAL);
    }
    let p = proc_mut(st, lead)?;
    let id = (0..uapi::MAX_QUEUES_PER_PROCESS)
        .find(|i| !p.queues.contains_key(i))
        .ok_or(libc::ENOSPC)?;
    let sdma = qtype == queue_type::SDMA || qtype == queue_type::SDMA_XGMI;
    let q = Queue {
        gpu,
        qtype,
        ring_base: a.ring_base_address,
        ring_size,
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
        sdma_id: if sdma { st.queues_on(gpu, true) } else { 0 },
        rptr: 0,
        halted: false,
    };
    add_queue(st, lead, id, q)?;
    let p = proc_mut(st, lead)?;
    // Fresh doorbell: wptr 0, so nothing runs before the first ring.
    p.pdds[gpu]
        .doorbells
        .as_ref()
        .unwrap()
        .write_u64(id as u64 * 8, 0);
    a.queue_id = id;
    a.doorbell_offset = p.doorbell_offset(gpu, id);
    p.slot_pinned = true;
    Ok(())
}

pub fn destroy_queue(
    st: &mut State,
    lead: u32,
    a: &mut sys::kfd_ioctl_destroy_queue_args,
) -> R<()> {
    let p = proc_mut(st, lead)?;
    p.queues.remove(&a.queue_id).map(|_| ()).ok_or(libc::EINVAL)
}

/// UPDATE_QUEUE.
pub fn update_queue(st: &mut State, lead: u32, a: &mut sys::kfd_ioctl_update_queue_args) -> R<()> {
    let p = proc_mut(st, lead)?;
    if a.queue_percentage > 100 || a.queue_priority > 15 {
        return Err(libc::EINVAL);
    }
    let rs = a.ring_size;
    if rs != 0 && !rs.is_power_of_two() || !a.ring_base_address.is_multiple_of(4) {
        return Err(libc::EINVAL);
    }
    let q = p.queues.get_mut(&a.queue_id).ok_or(libc::EINVAL)?;
    q.ring_base = a.ring_base_address;
    q.ring_size = rs;
    q.percent = a.queue_percentage;
    q.priority = a.queue_priority;
    Ok(())
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

/// CREATE_EVENT.  For signal events `event_page_offset` carries the
/// signal page BO handle on input (dGPU flow) and the events mmap offset
/// on output.
pub fn create_event(st: &mut State, lead: u32, a: &mut sys::kfd_ioctl_create_event_args) -> R<()> {
    let etype = a.event_type;
    if etype > event_type::LAST {
        return Err(libc::EINVAL);
    }
    let signal = etype == event_type::SIGNAL || etype == event_type::DEBUG;
    if signal {
        let h = a.event_page_offset;
        let has = proc_mut(st, lead)?.signal_page.is_some();
        if !has {
            attach_signal_page(st, lead, h)?;
        }
    }
    let p = proc_mut(st, lead)?;
    let id = if signal {
        let n = signal_slots(p);
        (0..n)
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
            data: [0; 32],
        },
    );
    a.event_id = id;
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
            done.push(w.finish(2));
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
pub fn wait_events(
    st: &mut State,
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
    for id in ids {
        let ev = p.events.get_mut(&id).unwrap();
        let active = ev.signaled;
        ev.signaled = ev.signaled && !ev.auto_reset;
        events.push((id, active));
    }
    let timeout = a.timeout;
    let deadline = (timeout != uapi::TIMEOUT_INFINITE)
        .then(|| Instant::now() + Duration::from_millis(timeout as u64));
    let w = Waiter {
        tid: caller.tid,
        events,
        all: a.wait_for_all != 0,
        deadline,
        reply,
        args: a,
        out_size,
    };
    let ready = if w.all {
        w.events.iter().all(|e| e.1)
    } else {
        w.events.iter().any(|e| e.1)
    };
    if ready {
        return Some(w.finish(uapi::WAIT_COMPLETE));
    }
    if timeout == 0 {
        return Some(w.finish(uapi::WAIT_TIMEOUT));
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

/// SET_MEMORY_POLICY: cache policies have no effect
/// on the emulated GPU, but the arguments are checked like KFD does.
pub fn set_memory_policy(
    st: &mut State,
    lead: u32,
    a: &mut sys::kfd_ioctl_set_memory_policy_args,
) -> R<()> {
    let p = proc_mut(st, lead)?;
    p.pdd_by_user_id(a.gpu_id).ok_or(libc::EINVAL)?;
    if a.default_policy > 1 || a.alternate_policy > 1 {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// GET_CLOCK_COUNTERS: the emulated GPU clock is CLOCK_MONOTONIC_RAW in ns.
pub fn clock_counters(
    st: &mut State,
    lead: u32,
    a: &mut sys::kfd_ioctl_get_clock_counters_args,
) -> R<()> {
    let p = proc_mut(st, lead)?;
    p.pdd_by_user_id(a.gpu_id).ok_or(libc::EINVAL)?;
    let now = |clk| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes the local timespec.
        unsafe { libc::clock_gettime(clk, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    };
    let raw = now(libc::CLOCK_MONOTONIC_RAW);
    a.gpu_clock_counter = raw;
    a.cpu_clock_counter = raw;
    a.system_clock_counter = now(libc::CLOCK_BOOTTIME);
    a.system_clock_freq = 1_000_000_000;
    Ok(())
}
