//! CRIU_OP: PROCESS_INFO, CHECKPOINT, UNPAUSE, RESTORE, RESUME, and the
//! private blob (B.5 layout, version 1, MAX_GPU_INSTANCE 64).  Each op
//! first asks [`crate::fault`] whether a test wants it to fail.
//!
//! A queue record holds KFD's values: the kernel's queue type and format
//! ([`kfd_abi::criu::queue_type`]), an MQD of KFD's size for the type
//! (2048 bytes per XCC for compute queues, 512 for SDMA queues) and, for a
//! compute queue with a context save area, a control stack of the size the
//! queue was created with (one per XCC), in Linux 6.18's layout
//! (`checkpoint_mqd_v9_4_3`): the MQDs of XCC 0, 1, ... one after the
//! other, then their control stacks in the same order.  Each MQD's first
//! bytes are the emulator's own ([`Mqd`]); a queue with a SET_CU_MASK mask
//! gets version 2, whose mask ([`CuMask`]) follows, as KFD's MQD holds the
//! CU mask; the rest is zero.  When PROCESS_INFO saved the waves of a
//! kernel dispatch into the queue's context save area, each XCC's control
//! stack holds the CP's record of that XCC's waves (`gfx9::cwsr::stack`,
//! ending at the stack's size; the XCC's MQD says how many bytes): RESTORE
//! gives them back to the queue, which rebuilds the waves of every XCC when
//! it runs after RESUME.  The rest is zero.
//!
//! RESTORE is as strict as a fixed kernel: an MQD size other than KFD's for
//! the queue's type, a control stack on an SDMA queue or larger than the
//! node's, an MQD whose control stack size is not the record's, a queue
//! type a process cannot own: EINVAL, before any state changes.  So is a
//! saved control stack that does not decode or whose waves do not fit in
//! the queue's save area.
//!
//! The `reserved` word of each device record (KFD writes 0 there) holds
//! the process' /dev/kfd slot ([`slot_word`]): RESTORE moves the restored
//! process back to it, so the doorbell, MMIO and events offsets it mapped
//! before the checkpoint stay its own (see `State::claim_slot`).

use std::collections::{BTreeMap, BTreeSet};
use std::mem::{offset_of, size_of};

use super::aql;
use super::kfd;
use super::mem::{user_read, user_write};
use super::shader::{check_stacks, SaveArea, SaveJob, Saved};
use super::state::bos::VaRanges;
use super::state::svm as ranges;
use super::state::{AqlState, BoKey, Done, Event, Gpu, MemoryException, Queue, State, R};
use super::svm;
use super::uapi::{self, alloc, kfd_off, layout, priv_blob as pb, queue_type, sys};
use super::uapi::{AsBytes, FromBytes};
use super::{Caller, FdResolver};
use kfd_abi::criu;

/// The emulator's MQD: the queue state the hardware would keep.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Mqd {
    magic: u32,
    version: u32,
    /// Read pointer in bytes (monotonic).
    rptr: u64,
    /// Write pointer (the doorbell's value).
    wptr: u64,
    ring_base: u64,
    ring_size: u32,
    halted: u32,
    /// Control stack size given at CREATE_QUEUE.
    ctl_stack_size: u32,
    /// Bytes of the control stack in use (a dispatch's waves were saved:
    /// the stack ends at `ctl_stack_size`, CP_HQD_CNTL_STACK_OFFSET is
    /// `ctl_stack_size - ctl_stack_used`); 0: none.
    ctl_stack_used: u32,
    pad: [u32; 4],
}

// SAFETY: integers only; the fields cover all 64 bytes (asserted below).
unsafe impl FromBytes for Mqd {}
// SAFETY: as above, no implicit padding.
unsafe impl AsBytes for Mqd {}

pub const MQD_SIZE: usize = size_of::<Mqd>();
const _: () = assert!(MQD_SIZE == 64 && offset_of!(Mqd, pad) == 48);
const MQD_MAGIC: u32 = u32::from_le_bytes(*b"KEMQ");

/// What MQD version 2 adds: the CU mask (SET_CU_MASK's, at most 1024 bits).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct CuMask {
    /// Mask words in use (1..=32).
    words: u32,
    pad: u32,
    mask: [u32; 32],
}

// SAFETY: integers only; the fields cover all 136 bytes (asserted below).
unsafe impl FromBytes for CuMask {}
// SAFETY: as above, no implicit padding.
unsafe impl AsBytes for CuMask {}

const CU_MASK_SIZE: usize = size_of::<CuMask>();
const _: () = assert!(CU_MASK_SIZE == 136);
// Both fit in the smallest MQD KFD writes.
const _: () = assert!(MQD_SIZE + CU_MASK_SIZE <= criu::SDMA_MQD_SIZE as usize);

/// The kernel's (type, format) of a queue of CREATE_QUEUE type `qtype`.
fn kernel_type(qtype: u32) -> (u32, u32) {
    match qtype {
        queue_type::SDMA => (criu::queue_type::SDMA, criu::queue_format::PM4),
        queue_type::SDMA_XGMI => (criu::queue_type::SDMA_XGMI, criu::queue_format::PM4),
        queue_type::SDMA_BY_ENG_ID => (criu::queue_type::SDMA_BY_ENG_ID, criu::queue_format::PM4),
        queue_type::COMPUTE_AQL => (criu::queue_type::COMPUTE, criu::queue_format::AQL),
        _ => (criu::queue_type::COMPUTE, criu::queue_format::PM4),
    }
}

/// The CREATE_QUEUE type of a record's kernel (type, format); EINVAL for a
/// type a process never owns.
fn ioctl_type(kernel: u32, format: u32) -> R<u32> {
    Ok(match (kernel, format) {
        (criu::queue_type::SDMA, criu::queue_format::PM4) => queue_type::SDMA,
        (criu::queue_type::SDMA_XGMI, criu::queue_format::PM4) => queue_type::SDMA_XGMI,
        (criu::queue_type::SDMA_BY_ENG_ID, criu::queue_format::PM4) => queue_type::SDMA_BY_ENG_ID,
        (criu::queue_type::COMPUTE, criu::queue_format::AQL) => queue_type::COMPUTE_AQL,
        (criu::queue_type::COMPUTE, criu::queue_format::PM4) => queue_type::COMPUTE,
        _ => return Err(libc::EINVAL),
    })
}

/// The MQD bytes of a queue's record on GPU `g`: KFD's size for its type.
fn mqd_size(q: &Queue, g: &Gpu) -> usize {
    criu::mqd_size(kernel_type(q.qtype).0, g.num_xcc).unwrap_or(0) as usize
}

/// The MQDs of a queue of kernel type `kernel` on GPU `g`: one per XCC
/// for a compute queue, one for an SDMA queue.
fn mqd_count(kernel: u32, g: &Gpu) -> usize {
    if criu::queue_type::is_sdma(kernel) {
        1
    } else {
        g.num_xcc as usize
    }
}

/// The control stack bytes of a queue's record: one stack per XCC for a
/// compute queue with a context save area (KFD's `cp_hqd_cntl_stack_size`
/// times the XCCs), none for SDMA queues.
fn ctl_stack_bytes(q: &Queue, g: &Gpu) -> usize {
    if q.is_sdma() || q.ctx_addr == 0 {
        0
    } else {
        q.ctl_stack_size as usize * g.num_xcc as usize
    }
}

/// Both for the record of `q` on GPU `g`.
fn queue_extra(q: &Queue, g: &Gpu) -> usize {
    mqd_size(q, g) + ctl_stack_bytes(q, g)
}
/// Upper bound for blobs we are asked to read (protects the daemon).
const MAX_PRIV: u64 = 256 << 20;

/// Marks a device record's `reserved` word as holding a slot (low half).
const SLOT_TAG: u64 = (u32::from_le_bytes(*b"KESL") as u64) << 32;

/// The device records' `reserved` word for a process in `slot`.
fn slot_word(slot: u32) -> u64 {
    SLOT_TAG | u64::from(slot)
}

/// The slot a device record's `reserved` word names: None for 0 (a blob
/// without one, as KFD writes), EINVAL for anything else that is not ours.
fn slot_of_word(w: u64) -> R<Option<u32>> {
    if w == 0 {
        return Ok(None);
    }
    let slot = w as u32;
    if w & !0xffff_ffff != SLOT_TAG || slot == 0 || slot > kfd_off::MAX_SLOT {
        return Err(libc::EINVAL);
    }
    Ok(Some(slot))
}

struct Counts {
    devices: u32,
    bos: u32,
    objects: u32,
    priv_size: u64,
}

fn counts(p: &super::state::Proc, gpus: &[Gpu]) -> Counts {
    let bos = p.bos.len() as u32;
    let queues = p.queues.len() as u64;
    let mqds: usize = p
        .queues
        .values()
        .map(|q| queue_extra(q, &gpus[q.gpu]))
        .sum();
    let events = p.events.len() as u64;
    let svms = p.svm.ranges.len() as u64;
    let n_pdds = p.n_pdds();
    Counts {
        devices: n_pdds as u32,
        bos,
        objects: (queues + events + svms) as u32,
        priv_size: (pb::PROCESS + pb::DEVICE * n_pdds + pb::BO * bos as usize) as u64
            + queues * pb::QUEUE as u64
            + mqds as u64
            + events * pb::EVENT as u64
            + svms * svm::record_size(n_pdds) as u64,
    }
}

/// The name of CRIU op `op` (KFD's, for logs).
pub fn op_name(op: u32) -> &'static str {
    match op {
        uapi::criu_op::PROCESS_INFO => "PROCESS_INFO",
        uapi::criu_op::CHECKPOINT => "CHECKPOINT",
        uapi::criu_op::UNPAUSE => "UNPAUSE",
        uapi::criu_op::RESTORE => "RESTORE",
        uapi::criu_op::RESUME => "RESUME",
        _ => "unknown",
    }
}

/// The pid of `lead` in its own (innermost) pid namespace.
fn ns_pid(lead: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{lead}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|v| v.split_whitespace().last().and_then(|x| x.parse().ok()))
        })
        .unwrap_or(lead)
}

/// The CRIU_OP answer: the caller's bytes with every field of `a` written
/// back (the struct has tail padding, so it is not encoded whole).
pub fn answer(a: &sys::kfd_ioctl_criu_args, input: &[u8], out_size: usize) -> Vec<u8> {
    type A = sys::kfd_ioctl_criu_args;
    let mut o = input.to_vec();
    o.resize(out_size, 0);
    uapi::put(&mut o, offset_of!(A, devices), &a.devices);
    uapi::put(&mut o, offset_of!(A, bos), &a.bos);
    uapi::put(&mut o, offset_of!(A, priv_data), &a.priv_data);
    uapi::put(&mut o, offset_of!(A, priv_data_size), &a.priv_data_size);
    uapi::put(&mut o, offset_of!(A, num_devices), &a.num_devices);
    uapi::put(&mut o, offset_of!(A, num_bos), &a.num_bos);
    uapi::put(&mut o, offset_of!(A, num_objects), &a.num_objects);
    uapi::put(&mut o, offset_of!(A, pid), &a.pid);
    uapi::put(&mut o, offset_of!(A, op), &a.op);
    o
}

/// PROCESS_INFO, under the state lock: evicts the process' queues and
/// returns what the shader engine must save, the dispatch in flight of
/// each queue that runs one (see [`saved`], which takes the outcomes).
pub fn process_info(
    st: &mut State,
    lead: u32,
    a: &mut sys::kfd_ioctl_criu_args,
) -> R<Vec<SaveJob>> {
    crate::fault::check(uapi::criu_op::PROCESS_INFO)?;
    let p = st.procs.get_mut(&lead).ok_or(libc::ESRCH)?;
    if p.n_pdds() == 0 {
        return Err(libc::ENODEV);
    }
    refuse_waves_without_save_area(p)?;
    p.paused = true;
    // SVM ranges the process unmapped are gone, as on KFD.
    if !p.svm.ranges.is_empty() {
        let vmas = ranges::vmas(lead)?;
        ranges::trim(p, &vmas);
    }
    let c = counts(p, &st.devs.gpus);
    a.priv_data_size = c.priv_size;
    a.num_devices = c.devices;
    a.num_bos = c.bos;
    a.num_objects = c.objects;
    a.pid = ns_pid(lead);
    Ok(p.queues
        .iter()
        .filter(|(_, q)| q.aql.running)
        .map(|(&id, q)| aql::save_job(p, id, q, st.devs.gpus[q.gpu].num_xcc))
        .collect())
}

/// PROCESS_INFO's end, under the state lock again: the waves of each
/// queue of `ids` are saved (its control stack kept with its MQD), or the
/// queue's dispatch ended meanwhile.  A queue whose waves could not be
/// saved fails the checkpoint (EBUSY, logged naming the process, GPU,
/// queue and why): the process is unpaused and runs on.
pub fn saved(st: &mut State, lead: u32, ids: &[u32], outcomes: Vec<Saved>) -> R<()> {
    let p = st.procs.get_mut(&lead).ok_or(libc::ESRCH)?;
    let mut failed = false;
    for (id, outcome) in ids.iter().zip(outcomes) {
        let Some(q) = p.queues.get_mut(id) else {
            continue;
        };
        match outcome {
            Saved::Idle => {}
            Saved::Stack(stacks) => aql::keep_saved(q, stacks),
            Saved::Failed(why) => {
                log::error!(
                    "kfd-emu: process {lead} GPU {:#x} AQL queue {id}: the waves of its kernel \
                     dispatch cannot be saved into its context save area at {:#x}: {why}; the \
                     checkpoint is refused (EBUSY) and the process runs on",
                    p.pdds[q.gpu].user_id,
                    q.ctx_addr
                );
                failed = true;
            }
        }
    }
    if failed {
        p.paused = false;
        return Err(libc::EBUSY);
    }
    Ok(())
}

/// A queue without a context save area (or control stack) cannot have its
/// waves saved: the checkpoint of a process with a dispatch running on one
/// is refused before anything is paused, and the process runs on.
fn refuse_waves_without_save_area(p: &super::state::Proc) -> R<()> {
    let busy = p
        .queues
        .iter()
        .find(|(_, q)| q.aql.running && (q.ctx_addr == 0 || q.ctl_stack_size == 0));
    if let Some((id, q)) = busy {
        log::error!(
            "kfd-emu: process {} GPU {:#x} AQL queue {id}: a kernel dispatch is in flight on a \
             queue without a context save area, where its waves cannot be saved; the \
             checkpoint is refused (EBUSY) and the process runs on",
            p.lead,
            p.pdds[q.gpu].user_id
        );
        return Err(libc::EBUSY);
    }
    Ok(())
}

pub fn unpause(st: &mut State, lead: u32) -> R<()> {
    crate::fault::check(uapi::criu_op::UNPAUSE)?;
    let p = st.procs.get_mut(&lead).ok_or(libc::ESRCH)?;
    if !p.paused {
        return Err(libc::EINVAL);
    }
    p.paused = false;
    // The checkpoint's dma-bufs stay dma-bufs while their BOs live, as
    // KFD's do (see `dmabuf`).
    Ok(())
}

/// The MQD of one XCC whose control stack holds `used` bytes.
fn encode_mqd(q: &Queue, g: &Gpu, wptr: u64, used: usize) -> Mqd {
    Mqd {
        magic: MQD_MAGIC,
        version: if q.cu_mask.is_empty() { 1 } else { 2 },
        rptr: q.rptr,
        wptr,
        ring_base: q.ring_base,
        ring_size: q.ring_size,
        halted: q.halted as u32,
        // The record's control stack size (per XCC): 0 for a queue whose
        // record holds none (SDMA, no save area), so that a RESTORE can
        // tie the two together.
        ctl_stack_size: if ctl_stack_bytes(q, g) == 0 {
            0
        } else {
            q.ctl_stack_size
        },
        ctl_stack_used: used as u32,
        pad: [0; 4],
    }
}

/// Appends a BO priv record.  The struct has tail padding, so it is
/// written field by field into zeroed bytes.
fn push_bo_priv(blob: &mut Vec<u8>, user_addr: u64, idr: u32, mapped: &[u32]) {
    let mut r = [0u8; pb::BO];
    uapi::put(&mut r, offset_of!(pb::BoPriv, user_addr), &user_addr);
    uapi::put(&mut r, offset_of!(pb::BoPriv, idr_handle), &idr);
    let at = offset_of!(pb::BoPriv, mapped_gpuids);
    for (j, id) in mapped.iter().take(pb::MAX_GPU_INSTANCE).enumerate() {
        uapi::put(&mut r, at + 4 * j, id);
    }
    blob.extend_from_slice(&r);
}

/// CHECKPOINT: the paused process' devices, BOs and private data (the
/// process record, device, BO, queue, event and SVM range records) into the
/// caller's buffers, whose sizes must be PROCESS_INFO's.
pub fn checkpoint(
    st: &mut State,
    lead: u32,
    caller: &Caller,
    a: &sys::kfd_ioctl_criu_args,
) -> R<()> {
    crate::fault::check(uapi::criu_op::CHECKPOINT)?;
    let (dev_ptr, bo_ptr, priv_ptr) = (a.devices, a.bos, a.priv_data);
    if dev_ptr == 0 || bo_ptr == 0 || priv_ptr == 0 {
        return Err(libc::EINVAL);
    }
    let p = st.procs.get_mut(&lead).ok_or(libc::ESRCH)?;
    if p.n_pdds() == 0 {
        return Err(libc::ENODEV);
    }
    if !p.paused {
        return Err(libc::EINVAL);
    }
    if !p.svm.ranges.is_empty() {
        let vmas = ranges::vmas(lead)?;
        ranges::trim(p, &vmas);
    }
    let gpus = &st.devs.gpus;
    let c = counts(p, gpus);
    if a.num_devices != c.devices
        || a.num_bos != c.bos
        || a.num_objects != c.objects
        || a.priv_data_size != c.priv_size
    {
        return Err(libc::EINVAL);
    }
    let mut blob = Vec::with_capacity(c.priv_size as usize);
    let rec = layout::kfd_criu_process_priv_data {
        version: pb::VERSION,
        xnack_mode: p.xnack as u32,
    };
    uapi::push(&mut blob, &rec);
    let devs = push_devices(p, gpus, &mut blob);
    let buckets = push_bos(p, &mut blob);
    for (&id, q) in &p.queues {
        push_queue(p, id, q, &gpus[q.gpu], &mut blob);
    }
    push_events(p, &mut blob);
    svm::checkpoint(p, &mut blob)?;
    debug_assert_eq!(blob.len() as u64, c.priv_size);
    user_write(caller.tid, priv_ptr, &blob)?;
    user_write(caller.tid, dev_ptr, &devs)?;
    user_write(caller.tid, bo_ptr, &buckets)?;
    Ok(())
}

/// The device records into `blob` (each names the process' /dev/kfd
/// slot); returns the device buckets.
fn push_devices(p: &super::state::Proc, gpus: &[Gpu], blob: &mut Vec<u8>) -> Vec<u8> {
    let mut devs = Vec::with_capacity(pb::DEVICE_BUCKET * p.n_pdds());
    for (i, pdd) in p.present() {
        uapi::push(
            blob,
            &layout::kfd_criu_device_priv_data {
                reserved: slot_word(p.slot),
            },
        );
        let d = sys::kfd_criu_device_bucket {
            user_gpu_id: pdd.user_id,
            actual_gpu_id: gpus[i].id,
            drm_fd: 0,
            pad: 0,
        };
        uapi::push(&mut devs, &d);
    }
    devs
}

/// The BO records into `blob`; returns the BO buckets.
fn push_bos(p: &super::state::Proc, blob: &mut Vec<u8>) -> Vec<u8> {
    let mut buckets = Vec::with_capacity(pb::BO_BUCKET * p.bos.len());
    for (key, bo) in &p.bos {
        let b = sys::kfd_criu_bo_bucket {
            addr: bo.va,
            size: bo.size,
            offset: bo.offset,
            restored_offset: 0,
            gpu_id: p.pdds[key.gpu].user_id,
            alloc_flags: bo.flags,
            dmabuf_fd: uapi::KFD_INVALID_FD,
            pad: 0,
        };
        uapi::push(&mut buckets, &b);
        let mapped: Vec<u32> = bo.mapped.iter().map(|g| p.pdds[*g].user_id).collect();
        push_bo_priv(blob, bo.user_addr, key.idr, &mapped);
    }
    buckets
}

/// Queue `id`'s record into `blob`, then its MQDs (each with the CU mask)
/// and its control stacks, each XCC's ending with the record of the waves
/// it saved.
fn push_queue(p: &super::state::Proc, id: u32, q: &Queue, g: &Gpu, blob: &mut Vec<u8>) {
    let (type_, format) = kernel_type(q.qtype);
    let wptr = p.pdds[q.gpu]
        .doorbells
        .as_ref()
        .and_then(|d| d.read_u64(q.doorbell_index as u64 * 8))
        .unwrap_or(0);
    let r = layout::kfd_criu_queue_priv_data {
        object_type: pb::OBJ_QUEUE,
        q_address: q.ring_base,
        q_size: q.ring_size as u64,
        read_ptr_addr: q.rptr_addr,
        write_ptr_addr: q.wptr_addr,
        doorbell_off: p.doorbell_offset(q.gpu, q.doorbell_index),
        eop_ring_buffer_address: q.eop_addr,
        ctx_save_restore_area_address: q.ctx_addr,
        gpu_id: p.pdds[q.gpu].user_id,
        type_,
        format,
        q_id: id,
        priority: q.priority,
        q_percent: q.percent,
        doorbell_id: q.doorbell_index,
        gws: (p.pdds[q.gpu].gws_queue == Some(id)) as u32,
        sdma_id: q.sdma_id,
        eop_ring_buffer_size: q.eop_size as u32,
        ctx_save_restore_area_size: q.ctx_size,
        ctl_stack_size: ctl_stack_bytes(q, g) as u32,
        mqd_size: mqd_size(q, g) as u32,
        ..Default::default()
    };
    uapi::push(blob, &r);
    let start = blob.len();
    blob.resize(start + queue_extra(q, g), 0);
    let mqds = mqd_count(type_, g);
    let per_mqd = mqd_size(q, g) / mqds;
    for x in 0..mqds {
        let used = q.aql.saved.get(x).map_or(0, Vec::len);
        let at = start + x * per_mqd;
        uapi::put(blob, at, &encode_mqd(q, g, wptr, used));
        if let Some(m) = cu_mask_record(&q.cu_mask) {
            uapi::put(blob, at + MQD_SIZE, &m);
        }
    }
    // Each XCC's control stack ends at its `ctl_stack_size`.  A queue
    // with no control stack in its record (SDMA queues, which libhsakmt
    // 6.4 still gives a `ctl_stack_size` when it makes them by engine id)
    // has no waves to save.
    if ctl_stack_bytes(q, g) != 0 {
        debug_assert!(q.aql.saved.len() <= mqds);
        let (stacks, size) = (start + mqd_size(q, g), q.ctl_stack_size as usize);
        for (x, stack) in q.aql.saved.iter().enumerate() {
            let end = stacks + (x + 1) * size;
            blob[end - stack.len()..end].copy_from_slice(stack);
        }
    }
}

/// MQD version 2's CU mask record; None without a mask.
fn cu_mask_record(cu_mask: &[u32]) -> Option<CuMask> {
    if cu_mask.is_empty() {
        return None;
    }
    let mut mask = [0u32; 32];
    mask[..cu_mask.len()].copy_from_slice(cu_mask);
    Some(CuMask {
        words: cu_mask.len() as u32,
        pad: 0,
        mask,
    })
}

/// The event records into `blob`; the first names the signal page BO.
fn push_events(p: &super::state::Proc, blob: &mut Vec<u8>) {
    let mut first = true;
    for (&id, ev) in &p.events {
        let user_handle = if first {
            p.signal_page.as_ref().and_then(|s| s.handle).unwrap_or(0)
        } else {
            0
        };
        first = false;
        let r = layout::kfd_criu_event_priv_data {
            object_type: pb::OBJ_EVENT,
            pad0: 0,
            user_handle,
            event_id: id,
            auto_reset: ev.auto_reset as u32,
            type_: ev.etype,
            signaled: ev.signaled as u32,
            exception_data: kfd::memory_exception(&ev.exception),
        };
        uapi::push(blob, &r);
    }
}

/// A restore, fully parsed and checked before any state changes.
struct Plan {
    xnack: bool,
    /// Per bucket: (gpu index, user id, render fh).
    devices: Vec<(usize, u32, u64)>,
    bos: Vec<PlanBo>,
    /// (queue id, queue, write pointer, holds the GPU's GWS).
    queues: Vec<(u32, Queue, u64, bool)>,
    events: Vec<(u32, Event)>,
    signal_handle: u64,
    /// SVM range records, applied at RESUME.
    svm: Vec<ranges::Record>,
    /// The /dev/kfd slot the process had at checkpoint, if recorded.
    slot: Option<u32>,
}

struct PlanBo {
    gpu: usize,
    idr: u32,
    va: u64,
    size: u64,
    flags: u32,
    user_addr: u64,
    mapped: BTreeSet<usize>,
}

struct Cursor<'a> {
    b: &'a [u8],
    off: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> R<&'a [u8]> {
        let end = self.off.checked_add(n).ok_or(libc::EINVAL)?;
        let s = self.b.get(self.off..end).ok_or(libc::EINVAL)?;
        self.off = end;
        Ok(s)
    }

    fn rec<T: FromBytes>(&mut self) -> R<T> {
        self.take(size_of::<T>()).map(uapi::decode)
    }
}

/// The caller's restore buffers, read whole: the private data, the device
/// buckets and the BO buckets.
struct RestoreArgs {
    blob: Vec<u8>,
    devb: Vec<u8>,
    bos: Vec<sys::kfd_criu_bo_bucket>,
}

/// The restore's pointers and counts, before anything is read.
fn check_restore_args(a: &sys::kfd_ioctl_criu_args) -> R<()> {
    let (dev_ptr, bo_ptr, priv_ptr, priv_size) = (a.devices, a.bos, a.priv_data, a.priv_data_size);
    let (n_dev, n_bo) = (a.num_devices as usize, a.num_bos as usize);
    if (n_bo > 0 && bo_ptr == 0) || dev_ptr == 0 || priv_ptr == 0 || priv_size == 0 || n_dev == 0 {
        return Err(libc::EINVAL);
    }
    if priv_size > MAX_PRIV || n_bo > (MAX_PRIV as usize / pb::BO) {
        return Err(libc::EINVAL);
    }
    Ok(())
}

fn read_restore_args(caller: &Caller, a: &sys::kfd_ioctl_criu_args) -> R<RestoreArgs> {
    let (dev_ptr, bo_ptr, priv_ptr, priv_size) = (a.devices, a.bos, a.priv_data, a.priv_data_size);
    let (n_dev, n_bo) = (a.num_devices as usize, a.num_bos as usize);
    let mut blob = vec![0u8; priv_size as usize];
    user_read(caller.tid, priv_ptr, &mut blob)?;
    let mut devb = vec![0u8; n_dev * pb::DEVICE_BUCKET];
    user_read(caller.tid, dev_ptr, &mut devb)?;
    let mut bob = vec![0u8; n_bo * pb::BO_BUCKET];
    user_read(caller.tid, bo_ptr, &mut bob)?;
    let bos = (0..n_bo).map(|i| uapi::nth(&bob, i)).collect();
    Ok(RestoreArgs { blob, devb, bos })
}

/// The devices a restore names, each checked against this host.
struct PlanDevices {
    /// Per bucket: (gpu index, user id, render fh).
    devices: Vec<(usize, u32, u64)>,
    user_to_gpu: BTreeMap<u32, usize>,
    slot: Option<u32>,
}

/// The device records and buckets: every one a GPU the process has a pdd
/// for, its render file that GPU's, the same slot word in all.
fn plan_devices(
    st: &State,
    p: &super::state::Proc,
    (caller, res): (&Caller, &dyn FdResolver),
    cur: &mut Cursor<'_>,
    devb: &[u8],
) -> R<PlanDevices> {
    let n_dev = devb.len() / pb::DEVICE_BUCKET;
    if n_dev != p.n_pdds() {
        return Err(libc::EINVAL);
    }
    let mut out = PlanDevices {
        devices: Vec::new(),
        user_to_gpu: BTreeMap::new(),
        slot: None,
    };
    for i in 0..n_dev {
        let rec: layout::kfd_criu_device_priv_data = cur.rec()?;
        // Every device record names the same slot.
        let s = slot_of_word(rec.reserved)?;
        if i == 0 {
            out.slot = s;
        } else if s != out.slot {
            return Err(libc::EINVAL);
        }
        let d: sys::kfd_criu_device_bucket = uapi::nth(devb, i);
        let (user, actual, fd) = (d.user_gpu_id, d.actual_gpu_id, d.drm_fd);
        // kfd_process_device_data_by_id: only a GPU the process has a pdd for.
        let gpu = st
            .devs
            .index_of(actual)
            .filter(|&g| !p.pdds[g].denied)
            .ok_or(libc::EINVAL)?;
        if user == 0
            || out.user_to_gpu.insert(user, gpu).is_some()
            || out.devices.iter().any(|d| d.0 == gpu)
        {
            return Err(libc::EINVAL);
        }
        let fh = res.open_of(caller.tgid, fd as i32)?;
        if st.opens.get(&fh).and_then(super::state::Open::render_gpu) != Some(gpu) {
            return Err(libc::EINVAL);
        }
        out.devices.push((gpu, user, fh));
    }
    Ok(out)
}

/// The BO records and buckets: sizes and places KFD accepts, no overlap,
/// unique handles, the VRAM each GPU has left.
fn plan_bos(
    st: &State,
    cur: &mut Cursor<'_>,
    bob: &[sys::kfd_criu_bo_bucket],
    user_to_gpu: &BTreeMap<u32, usize>,
) -> R<Vec<PlanBo>> {
    let mut bos = Vec::new();
    let mut vram = vec![0u64; st.devs.gpus.len()];
    let mut vas = VaRanges::default();
    let mut idrs = BTreeSet::new();
    for b in bob {
        let r: pb::BoPriv = cur.rec()?;
        let gpu = *user_to_gpu.get(&b.gpu_id).ok_or(libc::ENODEV)?;
        let (va, size, flags) = (b.addr, b.size, b.alloc_flags);
        let idr = r.idr_handle;
        let t = flags & alloc::TYPE_MASK;
        let size_ok = match t {
            alloc::VRAM | alloc::GTT | alloc::USERPTR => size > 0 && size % uapi::PAGE == 0,
            alloc::DOORBELL => size == uapi::DOORBELL_SLICE,
            alloc::MMIO_REMAP => size == uapi::PAGE,
            _ => false,
        };
        if !size_ok
            || va < uapi::GPUVM_BASE
            || va % uapi::PAGE != 0
            || va
                .checked_add(size)
                .is_none_or(|e| e - 1 > uapi::GPUVM_LIMIT)
        {
            return Err(libc::EINVAL);
        }
        if vas.overlaps(va, va + size) {
            return Err(libc::EINVAL);
        }
        vas.insert(va, va + size, ());
        if !idrs.insert((gpu, idr)) {
            return Err(libc::ENOMEM);
        }
        if t == alloc::VRAM {
            vram[gpu] += size;
        }
        let mut mapped = BTreeSet::new();
        for &id in &r.mapped_gpuids {
            if id == 0 {
                break;
            }
            mapped.insert(*user_to_gpu.get(&id).ok_or(libc::EINVAL)?);
        }
        let user_addr = r.user_addr;
        if t == alloc::USERPTR && (user_addr == 0 || !user_addr.is_multiple_of(uapi::PAGE)) {
            return Err(libc::EINVAL);
        }
        bos.push(PlanBo {
            gpu,
            idr,
            va,
            size,
            flags,
            user_addr,
            mapped,
        });
    }
    for (g, need) in vram.iter().enumerate() {
        if st.gpu_alloc[g].vram_used + need > st.devs.gpus[g].vram_size {
            return Err(libc::ENOMEM);
        }
    }
    Ok(bos)
}

/// The queues, events and SVM ranges of a restore, in record order.
#[derive(Default)]
struct PlanObjects {
    queues: Vec<(u32, Queue, u64, bool)>,
    events: Vec<(u32, Event)>,
    signal_handle: u64,
    svm: Vec<ranges::Record>,
    /// SDMA queues per GPU index so far.
    sdma_per_gpu: BTreeMap<usize, u32>,
}

/// A queue record: a queue id not taken, a ring KFD accepts, its MQD and
/// control stacks (`take_queue_extra`), an SDMA engine queue left.
fn plan_queue(
    st: &State,
    lead: u32,
    cur: &mut Cursor<'_>,
    user_to_gpu: &BTreeMap<u32, usize>,
    out: &mut PlanObjects,
) -> R<()> {
    let r: layout::kfd_criu_queue_priv_data = cur.rec()?;
    let gpu = *user_to_gpu.get(&r.gpu_id).ok_or(libc::EINVAL)?;
    let qtype = ioctl_type(r.type_, r.format)?;
    let extra = take_queue_extra(lead, cur, &r, qtype, &st.devs.gpus[gpu])?;
    let m = extra.mqd;
    let id = r.q_id;
    let ring_size = r.q_size;
    if id >= uapi::MAX_QUEUES_PER_PROCESS
        || out.queues.iter().any(|q| q.0 == id)
        || ring_size > u32::MAX as u64
        || (ring_size != 0 && !ring_size.is_power_of_two())
        || m.ring_base != r.q_address
    {
        return Err(libc::EINVAL);
    }
    let q = Queue {
        gpu,
        qtype,
        ring_base: r.q_address,
        ring_size: ring_size as u32,
        rptr_addr: r.read_ptr_addr,
        wptr_addr: r.write_ptr_addr,
        percent: r.q_percent,
        priority: r.priority,
        eop_addr: r.eop_ring_buffer_address,
        eop_size: r.eop_ring_buffer_size as u64,
        ctx_addr: r.ctx_save_restore_area_address,
        ctx_size: r.ctx_save_restore_area_size,
        ctl_stack_size: m.ctl_stack_size,
        doorbell_index: id,
        sdma_id: r.sdma_id,
        rptr: m.rptr,
        halted: m.halted != 0,
        cu_mask: extra.cu_mask,
        aql: AqlState {
            saved: extra.saved,
            ..Default::default()
        },
        engine: Default::default(),
    };
    kfd::check_cwsr_sizes(st, lead, &q, "RESTORE")?;
    if q.is_sdma() {
        // SDMA queues need a free engine queue; the other limits are
        // checked as the queues are added.
        let cnt = out.sdma_per_gpu.entry(gpu).or_insert(0);
        *cnt += 1;
        if st.queues_on(gpu, true) + *cnt > st.devs.gpus[gpu].max_sdma_queues {
            return Err(libc::ENOMEM);
        }
    }
    out.queues.push((id, q, m.wptr, r.gws != 0));
    Ok(())
}

/// An event record: an id and type KFD accepts, not taken; the first
/// record alone may name the signal page BO, a VRAM or GTT one of the
/// restore's.
fn plan_event(
    p: &super::state::Proc,
    cur: &mut Cursor<'_>,
    (devices, bos): (&[(usize, u32, u64)], &[PlanBo]),
    out: &mut PlanObjects,
) -> R<()> {
    let r: layout::kfd_criu_event_priv_data = cur.rec()?;
    let id = r.event_id;
    let etype = r.type_;
    let signal = etype == uapi::event_type::SIGNAL || etype == uapi::event_type::DEBUG;
    if etype > uapi::event_type::LAST
        || p.events.contains_key(&id)
        || out.events.iter().any(|e| e.0 == id)
        || (signal && id >= uapi::SIGNAL_EVENT_LIMIT)
        || (!signal && id < uapi::FIRST_NONSIGNAL_EVENT_ID)
    {
        return Err(libc::EINVAL);
    }
    if signal && id == 0 {
        // Id 0 is KFD's own (the IDR refuses it).
        return Err(libc::ENOSPC);
    }
    let h = r.user_handle;
    if h != 0 {
        if out.signal_handle != 0 || !out.events.is_empty() {
            return Err(libc::EINVAL);
        }
        let ok = bos.iter().any(|b| {
            let uid = devices
                .iter()
                .find(|d| d.0 == b.gpu)
                .map(|d| d.1)
                .unwrap_or(0);
            ((uid as u64) << 32 | b.idr as u64) == h
                && matches!(b.flags & alloc::TYPE_MASK, alloc::VRAM | alloc::GTT)
        });
        if !ok {
            return Err(libc::EINVAL);
        }
        out.signal_handle = h;
    }
    out.events.push((
        id,
        Event {
            etype,
            auto_reset: r.auto_reset != 0,
            signaled: r.signaled != 0,
            node_id: 0,
            trigger_data: 0,
            exception: MemoryException::Saved(r.exception_data),
            // KFD's event record carries no age.
            age: super::state::FIRST_EVENT_AGE,
        },
    ));
    Ok(())
}

/// Reads the caller's buffers and checks every record before any state
/// changes: the process record, the devices, the BOs, then the queues,
/// events and SVM ranges in the order they come; every byte of the private
/// data is accounted for.
fn plan_restore(
    st: &State,
    lead: u32,
    caller: &Caller,
    res: &dyn FdResolver,
    a: &sys::kfd_ioctl_criu_args,
) -> R<(Plan, Vec<sys::kfd_criu_bo_bucket>)> {
    check_restore_args(a)?;
    let p = st.procs.get(&lead).ok_or(libc::ESRCH)?;
    if p.pdds.iter().any(|d| d.vm.is_some()) || !p.bos.is_empty() || !p.queues.is_empty() {
        return Err(libc::EINVAL);
    }
    let args = read_restore_args(caller, a)?;
    let mut cur = Cursor {
        b: &args.blob,
        off: 0,
    };
    let pr: layout::kfd_criu_process_priv_data = cur.rec()?;
    if pr.version != pb::VERSION {
        return Err(libc::EINVAL);
    }
    let xnack = pr.xnack_mode != 0;
    if xnack && !kfd::xnack_supported(&st.devs) {
        return Err(libc::EPERM);
    }
    let devs = plan_devices(st, p, (caller, res), &mut cur, &args.devb)?;
    let bos = plan_bos(st, &mut cur, &args.bos, &devs.user_to_gpu)?;
    let mut objs = PlanObjects::default();
    for _ in 0..a.num_objects {
        let at = cur.off;
        let ty: u32 = cur.rec()?;
        cur.off = at;
        match ty {
            pb::OBJ_QUEUE => plan_queue(st, lead, &mut cur, &devs.user_to_gpu, &mut objs)?,
            pb::OBJ_EVENT => plan_event(p, &mut cur, (&devs.devices, &bos), &mut objs)?,
            pb::OBJ_SVM_RANGE => {
                // Kept for RESUME unchecked, as KFD does.
                let n_dev = devs.devices.len();
                let b = cur.take(svm::record_size(n_dev))?;
                objs.svm.push(svm::parse_record(b, n_dev));
            }
            _ => return Err(libc::EINVAL),
        }
    }
    if cur.off != args.blob.len() {
        return Err(libc::EINVAL);
    }
    Ok((
        Plan {
            xnack,
            devices: devs.devices,
            bos,
            queues: objs.queues,
            events: objs.events,
            signal_handle: objs.signal_handle,
            svm: objs.svm,
            slot: devs.slot,
        },
        args.bos,
    ))
}

/// What a queue record's MQDs and control stacks hold.
struct QueueExtra {
    /// XCC 0's MQD (the others agree with it).
    mqd: Mqd,
    cu_mask: Vec<u32>,
    /// The used end of each XCC's control stack (see [`Mqd`]); empty: no
    /// saved dispatch.
    saved: Vec<Vec<u8>>,
}

/// Refuses a queue record of process `lead`'s RESTORE: logs the process,
/// GPU, queue and field, and gives EINVAL.
fn refuse_queue(lead: u32, r: &layout::kfd_criu_queue_priv_data, why: std::fmt::Arguments) -> i32 {
    let (gpu, id) = (r.gpu_id, r.q_id);
    log::error!("kfd-emu: process {lead} GPU {gpu:#x} queue {id}: RESTORE refused (EINVAL): {why}");
    libc::EINVAL
}

/// "MQD" of XCC `x` of `n`, named where the GPU has several.
fn mqd_name(x: usize, n: usize) -> String {
    if n > 1 {
        format!("XCC {x}: MQD")
    } else {
        "MQD".into()
    }
}

/// A queue record's MQDs and control stacks, checked as a fixed kernel
/// checks them before it copies any: MQDs of exactly KFD's size for the
/// type on this GPU (one per XCC for a compute queue: a record of a GPU
/// with another XCC count is refused), no control stack on an SDMA queue,
/// one per XCC on a compute queue and none larger than the node's (the
/// most a queue's allocation holds), and MQDs whose control stack size is
/// the record's (per XCC; 0 where the record has none): the next checkpoint
/// writes stacks of that size.  The used control stacks are decoded and
/// checked ([`check_saved_stacks`]); what only the queue's memory can tell
/// (the packet at the read pointer, the wave blocks) is the CP's to check
/// when the queue runs.
fn take_queue_extra(
    lead: u32,
    cur: &mut Cursor<'_>,
    r: &layout::kfd_criu_queue_priv_data,
    qtype: u32,
    g: &Gpu,
) -> R<QueueExtra> {
    let (kernel, _) = kernel_type(qtype);
    let want = criu::mqd_size(kernel, g.num_xcc).ok_or(libc::EINVAL)?;
    let ctl = r.ctl_stack_size;
    let ctl_ok = if criu::queue_type::is_sdma(kernel) {
        ctl == 0
    } else {
        ctl.is_multiple_of(g.num_xcc) && ctl / g.num_xcc <= g.ctl_stack_size
    };
    if r.mqd_size != want {
        let mqd = r.mqd_size;
        return Err(refuse_queue(
            lead,
            r,
            format_args!(
                "mqd_size {mqd}, KFD's MQDs of this queue type on this GPU ({} XCC(s)) are {want} \
                 bytes",
                g.num_xcc
            ),
        ));
    }
    if !ctl_ok {
        return Err(libc::EINVAL);
    }
    let mqds = cur.take(want as usize)?;
    let stacks = cur.take(ctl as usize)?;
    let n = mqd_count(kernel, g);
    let per_mqd = want as usize / n;
    let per_xcc = ctl / g.num_xcc;
    let m: Vec<Mqd> = (0..n)
        .map(|x| uapi::decode(&mqds[x * per_mqd..(x + 1) * per_mqd]))
        .collect();
    check_mqds(lead, r, &m, per_xcc)?;
    let size = per_xcc as usize;
    let saved: Vec<Vec<u8>> = m
        .iter()
        .enumerate()
        .map(|(x, mx)| {
            let used = mx.ctl_stack_used as usize;
            stacks[x * size + size - used..(x + 1) * size].to_vec()
        })
        .collect();
    let saved = if saved.iter().all(Vec::is_empty) {
        Vec::new()
    } else {
        saved
    };
    check_saved_stacks(lead, r, g, &saved)?;
    let cu_mask = if m[0].version == 2 {
        let c: CuMask = uapi::decode(&mqds[MQD_SIZE..per_mqd]);
        if c.words == 0 || c.words > 32 {
            return Err(libc::EINVAL);
        }
        c.mask[..c.words as usize].to_vec()
    } else {
        Vec::new()
    };
    Ok(QueueExtra {
        mqd: m[0],
        cu_mask,
        saved,
    })
}

/// Each XCC's MQD: ours (magic, version), its control stack size the
/// record's per-XCC size, its used stack within it (none without a save
/// area), and the queue state of XCC 0's MQD (all XCCs run one queue).
fn check_mqds(lead: u32, r: &layout::kfd_criu_queue_priv_data, m: &[Mqd], per_xcc: u32) -> R<()> {
    let n = m.len();
    for (x, mx) in m.iter().enumerate() {
        let name = mqd_name(x, n);
        if mx.magic != MQD_MAGIC || !(mx.version == 1 || mx.version == 2) {
            let (magic, version) = (mx.magic, mx.version);
            return Err(refuse_queue(
                lead,
                r,
                format_args!("{name} magic {magic:#x} version {version}: not the CP model's"),
            ));
        }
        if mx.ctl_stack_size != per_xcc {
            return Err(refuse_queue(
                lead,
                r,
                format_args!(
                    "{name} ctl_stack_size {:#x}, the record's control stack is {per_xcc:#x} \
                     bytes per XCC",
                    mx.ctl_stack_size
                ),
            ));
        }
        if mx.ctl_stack_used > per_xcc
            || (mx.ctl_stack_used > 0 && r.ctx_save_restore_area_address == 0)
        {
            return Err(refuse_queue(
                lead,
                r,
                format_args!(
                    "{name} ctl_stack_used {:#x}: more than its {per_xcc:#x}-byte control stack \
                     or a queue without a context save area",
                    mx.ctl_stack_used
                ),
            ));
        }
        if let Some(field) = mqd_differs(&m[0], mx) {
            return Err(refuse_queue(
                lead,
                r,
                format_args!("{name} {field}: not XCC 0's (every XCC runs the one queue)"),
            ));
        }
    }
    Ok(())
}

/// The queue state field in which XCC MQD `m` differs from XCC 0's `m0`.
fn mqd_differs(m0: &Mqd, m: &Mqd) -> Option<&'static str> {
    let fields = [
        ("version", m.version == m0.version),
        ("rptr", m.rptr == m0.rptr),
        ("wptr", m.wptr == m0.wptr),
        ("ring_base", m.ring_base == m0.ring_base),
        ("ring_size", m.ring_size == m0.ring_size),
        ("halted", m.halted == m0.halted),
    ];
    fields.iter().find(|f| !f.1).map(|f| f.0)
}

/// The used control stacks of a queue record, checked as the CP will when
/// the queue runs, as far as it can be without the queue's memory (see
/// `shader::check_stacks`): every XCC's holds the dispatch, and a damaged
/// one fails the RESTORE (EINVAL, logged naming the XCC and field) rather
/// than the queue after it.
fn check_saved_stacks(
    lead: u32,
    r: &layout::kfd_criu_queue_priv_data,
    g: &Gpu,
    saved: &[Vec<u8>],
) -> R<()> {
    if saved.is_empty() {
        return Ok(());
    }
    if let Some(x) = saved.iter().position(Vec::is_empty) {
        return Err(refuse_queue(
            lead,
            r,
            format_args!(
                "XCC {x}: control stack: empty, while another XCC's holds a saved dispatch (every \
                 XCC writes its own)"
            ),
        ));
    }
    let Some(target) = super::shader_target(g) else {
        return Err(refuse_queue(
            lead,
            r,
            format_args!("control stack: saved waves, but the GPU runs no shader"),
        ));
    };
    let area = SaveArea {
        addr: r.ctx_save_restore_area_address,
        size: r.ctx_save_restore_area_size,
        ctl_stack_size: r.ctl_stack_size / g.num_xcc,
    };
    match check_stacks(target, saved, area) {
        Ok(_) => Ok(()),
        Err(why) => Err(refuse_queue(lead, r, format_args!("{why}"))),
    }
}

/// RESTORE: validate everything, then apply; an error while applying
/// (only memory exhaustion can happen then) undoes what was applied.
pub fn restore(
    st: &mut State,
    lead: u32,
    caller: &Caller,
    res: &dyn FdResolver,
    a: &sys::kfd_ioctl_criu_args,
) -> R<()> {
    crate::fault::check(uapi::criu_op::RESTORE)?;
    let (plan, mut buckets) = plan_restore(st, lead, caller, res, a)?;
    // Before anything that hands out offsets naming the slot.
    let moved = match plan.slot {
        Some(slot) => st.claim_slot(lead, slot)?,
        None => None,
    };
    let saved_ids: Vec<u32> = st.procs[&lead].pdds.iter().map(|d| d.user_id).collect();
    let had_page = st.procs[&lead].signal_page.is_some();
    let r = apply(st, lead, &plan, &mut buckets);
    if let Err(e) = r {
        let p = st.procs.get_mut(&lead).unwrap();
        let bos = std::mem::take(&mut p.bos);
        p.queues.clear();
        for (id, _) in &plan.events {
            p.events.remove(id);
        }
        if !had_page {
            p.signal_page = None;
        }
        for (d, id) in p.pdds.iter_mut().zip(saved_ids) {
            d.vm = None;
            d.user_id = id;
            d.gws_queue = None;
        }
        p.restore_pending = false;
        p.svm.pending.clear();
        for (k, bo) in &bos {
            st.free_bo_memory(k.gpu, bo);
        }
        if let Some(m) = moved {
            st.undo_slot_move(m);
        }
        return Err(e);
    }
    // The restored process' old mappings name this slot now.
    st.procs.get_mut(&lead).unwrap().slot_pinned = true;
    let mut out = Vec::with_capacity(buckets.len() * pb::BO_BUCKET);
    for b in &buckets {
        uapi::push(&mut out, b);
    }
    user_write(caller.tid, a.bos, &out)
}

fn apply(st: &mut State, lead: u32, plan: &Plan, buckets: &mut [sys::kfd_criu_bo_bucket]) -> R<()> {
    {
        let p = st.procs.get_mut(&lead).unwrap();
        p.xnack = plan.xnack;
        p.restore_pending = true;
        p.svm.pending = plan.svm.clone();
        for &(gpu, user, fh) in &plan.devices {
            p.pdds[gpu].user_id = user;
            p.pdds[gpu].vm = Some(fh);
        }
    }
    for (i, b) in plan.bos.iter().enumerate() {
        let (key, offset) = kfd::create_bo(
            st,
            lead,
            b.gpu,
            b.va,
            b.size,
            b.flags,
            b.user_addr,
            Some(b.idr),
        )?;
        let p = st.procs.get_mut(&lead).unwrap();
        *p.bos.mapped_mut(&key).unwrap() = b.mapped.clone();
        let bk = &mut buckets[i];
        bk.restored_offset = if b.flags & alloc::TYPE_MASK == alloc::USERPTR {
            0
        } else {
            offset
        };
        bk.dmabuf_fd = uapi::KFD_INVALID_FD;
        debug_assert_eq!(
            key,
            BoKey {
                gpu: b.gpu,
                idr: b.idr
            }
        );
    }
    for (id, q, wptr, gws) in &plan.queues {
        let (gpu, idx) = (q.gpu, q.doorbell_index);
        kfd::add_queue(st, lead, *id, q.clone())?;
        let has_gws = st.devs.gpus[gpu].num_gws != 0;
        let p = st.procs.get_mut(&lead).unwrap();
        if *gws {
            // pqm_set_gws with the GPU's GWS, or none: EINVAL then.
            kfd::set_gws(p, *id, gpu, has_gws)?;
        }
        p.pdds[gpu]
            .doorbells
            .as_ref()
            .unwrap()
            .write_u64(idx as u64 * 8, *wptr);
    }
    let need_page = plan
        .events
        .iter()
        .any(|(_, e)| e.etype == uapi::event_type::SIGNAL || e.etype == uapi::event_type::DEBUG);
    if need_page || plan.signal_handle != 0 {
        kfd::attach_signal_page(st, lead, plan.signal_handle)?;
    }
    let p = st.procs.get_mut(&lead).unwrap();
    for (id, ev) in &plan.events {
        p.events.insert(*id, ev.clone());
    }
    Ok(())
}

/// The `NSpid:` line of a task: its pid in every pid namespace from the
/// daemon's down to its own.
fn ns_pids(tid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("NSpid:")).map(|v| {
                v.split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
        })
        .unwrap_or_default()
}

/// The KFD process whose lead thread has pid `pid` in the pid namespace of
/// `caller` (KFD's `find_get_pid` runs in the caller's namespace: criu
/// inside zdtm's or a container's pid namespace names the task by the pid
/// it sees).  A process is visible at the caller's level when it lives in
/// that namespace or below it.
fn lead_seen_by(st: &State, caller: u32, pid: u32) -> Option<u32> {
    let level = ns_pids(caller).len().max(1);
    st.procs
        .keys()
        .copied()
        .find(|&lead| ns_pids(lead).get(level - 1) == Some(&pid))
}

pub fn resume(st: &mut State, caller: u32, pid: u32, done: &mut Done) -> R<()> {
    crate::fault::check(uapi::criu_op::RESUME)?;
    let lead = lead_seen_by(st, caller, pid).ok_or(libc::ESRCH)?;
    let p = st.procs.get_mut(&lead).ok_or(libc::ESRCH)?;
    if !p.restore_pending {
        return Err(libc::EINVAL);
    }
    // The restored SVM ranges first (kfd_criu_resume_svm); a failure
    // leaves the process evicted, as KFD leaves it.
    ranges::resume(p)?;
    p.restore_pending = false;
    // What a restoring tool wrote through the BOs' dma-bufs reaches the
    // BOs before the queues run (see `dmabuf`).
    for (k, bo) in &p.bos {
        st.devs.dmabufs.fill_back(k.gpu, bo.offset);
    }
    let _ = done;
    Ok(())
}
