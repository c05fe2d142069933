//! CRIU_OP: PROCESS_INFO, CHECKPOINT, UNPAUSE, RESTORE, RESUME, and the
//! private blob (B.5 layout, version 1, MAX_GPU_INSTANCE 64).
//!
//! The MQD part of a queue record is the emulator's own (MQD_SIZE bytes):
//!
//! ```text
//!  @0  u32 magic "KEMQ"   @4  u32 version 1
//!  @8  u64 read pointer (bytes)    @16 u64 write pointer (doorbell value)
//!  @24 u64 ring base       @32 u32 ring size   @36 u32 halted
//!  @40 u32 control stack size given at CREATE_QUEUE
//! ```
//!
//! No control stack bytes follow (no waves ever run), so the record's
//! `ctl_stack_size` is 0.

use std::collections::{BTreeMap, BTreeSet};

use super::kfd;
use super::mem::{user_read, user_write};
use super::state::{BoKey, Done, Event, Queue, State, R};
use super::uapi::{self, alloc, get_u32, get_u64, priv_blob as pb, put_u32, put_u64, Args};
use super::{Caller, FdResolver};

pub const MQD_SIZE: usize = 64;
const MQD_MAGIC: u32 = u32::from_le_bytes(*b"KEMQ");
/// Upper bound for blobs we are asked to read (protects the daemon).
const MAX_PRIV: u64 = 256 << 20;

struct Counts {
    devices: u32,
    bos: u32,
    objects: u32,
    priv_size: u64,
}

fn counts(p: &super::state::Proc) -> Counts {
    let bos = p.bos.len() as u32;
    let queues = p.queues.len() as u64;
    let events = p.events.len() as u64;
    Counts {
        devices: p.pdds.len() as u32,
        bos,
        objects: (queues + events) as u32,
        priv_size: (pb::PROCESS + pb::DEVICE * p.pdds.len() + pb::BO * bos as usize) as u64
            + queues * (pb::QUEUE + MQD_SIZE) as u64
            + events * pb::EVENT as u64,
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

pub fn process_info(st: &mut State, lead: u32, a: &mut Args) -> R<()> {
    let p = st.procs.get_mut(&lead).ok_or(libc::ESRCH)?;
    if p.pdds.is_empty() {
        return Err(libc::ENODEV);
    }
    p.paused = true;
    let c = counts(p);
    a.set_u64(24, c.priv_size);
    a.set_u32(32, c.devices);
    a.set_u32(36, c.bos);
    a.set_u32(40, c.objects);
    a.set_u32(44, ns_pid(lead));
    Ok(())
}

pub fn unpause(st: &mut State, lead: u32) -> R<()> {
    let p = st.procs.get_mut(&lead).ok_or(libc::ESRCH)?;
    if !p.paused {
        return Err(libc::EINVAL);
    }
    p.paused = false;
    Ok(())
}

fn encode_mqd(q: &Queue, wptr: u64) -> [u8; MQD_SIZE] {
    let mut m = [0u8; MQD_SIZE];
    put_u32(&mut m, 0, MQD_MAGIC);
    put_u32(&mut m, 4, 1);
    put_u64(&mut m, 8, q.rptr);
    put_u64(&mut m, 16, wptr);
    put_u64(&mut m, 24, q.ring_base);
    put_u32(&mut m, 32, q.ring_size);
    put_u32(&mut m, 36, q.halted as u32);
    put_u32(&mut m, 40, q.ctl_stack_size);
    m
}

pub fn checkpoint(st: &mut State, lead: u32, caller: &Caller, a: &mut Args) -> R<()> {
    let (dev_ptr, bo_ptr, priv_ptr) = (a.u64(0), a.u64(8), a.u64(16));
    if dev_ptr == 0 || bo_ptr == 0 || priv_ptr == 0 {
        return Err(libc::EINVAL);
    }
    let p = st.procs.get(&lead).ok_or(libc::ESRCH)?;
    if p.pdds.is_empty() {
        return Err(libc::ENODEV);
    }
    if !p.paused {
        return Err(libc::EINVAL);
    }
    let c = counts(p);
    if a.u32(32) != c.devices
        || a.u32(36) != c.bos
        || a.u32(40) != c.objects
        || a.u64(24) != c.priv_size
    {
        return Err(libc::EINVAL);
    }
    let mut blob = Vec::with_capacity(c.priv_size as usize);
    let mut rec = [0u8; pb::PROCESS];
    put_u32(&mut rec, 0, pb::VERSION);
    put_u32(&mut rec, 4, p.xnack as u32);
    blob.extend_from_slice(&rec);
    let mut devs = vec![0u8; pb::DEVICE_BUCKET * p.pdds.len()];
    for (i, pdd) in p.pdds.iter().enumerate() {
        blob.extend_from_slice(&[0u8; pb::DEVICE]);
        put_u32(&mut devs, i * 16, pdd.user_id);
        put_u32(&mut devs, i * 16 + 4, st.devs.gpus[i].id);
    }
    let mut buckets = vec![0u8; pb::BO_BUCKET * p.bos.len()];
    for (i, (key, bo)) in p.bos.iter().enumerate() {
        let b = &mut buckets[i * pb::BO_BUCKET..(i + 1) * pb::BO_BUCKET];
        put_u64(b, 0, bo.va);
        put_u64(b, 8, bo.size);
        put_u64(b, 16, bo.offset);
        put_u32(b, 32, p.pdds[key.gpu].user_id);
        put_u32(b, 36, bo.flags);
        put_u32(b, 40, uapi::KFD_INVALID_FD);
        let mut r = [0u8; pb::BO];
        put_u64(&mut r, 0, bo.user_addr);
        put_u32(&mut r, 8, key.idr);
        for (j, g) in bo.mapped.iter().enumerate() {
            put_u32(&mut r, 12 + 4 * j, p.pdds[*g].user_id);
        }
        blob.extend_from_slice(&r);
    }
    for (&id, q) in &p.queues {
        let wptr = p.pdds[q.gpu]
            .doorbells
            .as_ref()
            .and_then(|d| d.read_u64(q.doorbell_index as u64 * 8))
            .unwrap_or(0);
        let mut r = [0u8; pb::QUEUE];
        put_u32(&mut r, 0, pb::OBJ_QUEUE);
        put_u64(&mut r, 8, q.ring_base);
        put_u64(&mut r, 16, q.ring_size as u64);
        put_u64(&mut r, 24, q.rptr_addr);
        put_u64(&mut r, 32, q.wptr_addr);
        put_u64(&mut r, 40, p.doorbell_offset(q.gpu, q.doorbell_index));
        put_u64(&mut r, 48, q.eop_addr);
        put_u64(&mut r, 56, q.ctx_addr);
        put_u32(&mut r, 64, p.pdds[q.gpu].user_id);
        put_u32(&mut r, 68, q.qtype);
        put_u32(&mut r, 76, id);
        put_u32(&mut r, 80, q.priority);
        put_u32(&mut r, 84, q.percent);
        put_u32(&mut r, 88, q.doorbell_index);
        put_u32(&mut r, 96, q.sdma_id);
        put_u32(&mut r, 100, q.eop_size as u32);
        put_u32(&mut r, 104, q.ctx_size);
        put_u32(&mut r, 108, 0);
        put_u32(&mut r, 112, MQD_SIZE as u32);
        blob.extend_from_slice(&r);
        blob.extend_from_slice(&encode_mqd(q, wptr));
    }
    let mut first = true;
    for (&id, ev) in &p.events {
        let mut r = [0u8; pb::EVENT];
        put_u32(&mut r, 0, pb::OBJ_EVENT);
        if first {
            put_u64(
                &mut r,
                8,
                p.signal_page.as_ref().and_then(|s| s.handle).unwrap_or(0),
            );
            first = false;
        }
        put_u32(&mut r, 16, id);
        put_u32(&mut r, 20, ev.auto_reset as u32);
        put_u32(&mut r, 24, ev.etype);
        put_u32(&mut r, 28, ev.signaled as u32);
        r[32..64].copy_from_slice(&ev.data);
        blob.extend_from_slice(&r);
    }
    debug_assert_eq!(blob.len() as u64, c.priv_size);
    user_write(caller.tid, priv_ptr, &blob)?;
    user_write(caller.tid, dev_ptr, &devs)?;
    user_write(caller.tid, bo_ptr, &buckets)?;
    Ok(())
}

/// A restore, fully parsed and checked before any state changes.
struct Plan {
    xnack: bool,
    /// Per bucket: (gpu index, user id, render fh).
    devices: Vec<(usize, u32, u64)>,
    bos: Vec<PlanBo>,
    queues: Vec<(u32, Queue, u64)>,
    events: Vec<(u32, Event)>,
    signal_handle: u64,
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
}

fn plan_restore(
    st: &State,
    lead: u32,
    caller: &Caller,
    res: &dyn FdResolver,
    a: &Args,
) -> R<(Plan, Vec<u8>)> {
    let (dev_ptr, bo_ptr, priv_ptr, priv_size) = (a.u64(0), a.u64(8), a.u64(16), a.u64(24));
    let (n_dev, n_bo, n_obj) = (a.u32(32) as usize, a.u32(36) as usize, a.u32(40) as usize);
    if dev_ptr == 0 || bo_ptr == 0 || priv_ptr == 0 || priv_size == 0 || n_dev == 0 || n_bo == 0 {
        return Err(libc::EINVAL);
    }
    if priv_size > MAX_PRIV || n_bo > (MAX_PRIV as usize / pb::BO) {
        return Err(libc::EINVAL);
    }
    let p = st.procs.get(&lead).ok_or(libc::ESRCH)?;
    if p.pdds.iter().any(|d| d.vm.is_some()) || !p.bos.is_empty() || !p.queues.is_empty() {
        return Err(libc::EINVAL);
    }
    let mut blob = vec![0u8; priv_size as usize];
    user_read(caller.tid, priv_ptr, &mut blob)?;
    let mut devb = vec![0u8; n_dev * pb::DEVICE_BUCKET];
    user_read(caller.tid, dev_ptr, &mut devb)?;
    let mut bob = vec![0u8; n_bo * pb::BO_BUCKET];
    user_read(caller.tid, bo_ptr, &mut bob)?;

    let mut cur = Cursor { b: &blob, off: 0 };
    let pr = cur.take(pb::PROCESS)?;
    if get_u32(pr, 0) != pb::VERSION {
        return Err(libc::EINVAL);
    }
    let xnack = get_u32(pr, 4) != 0;
    if n_dev != p.pdds.len() {
        return Err(libc::EINVAL);
    }
    let mut devices = Vec::new();
    let mut user_to_gpu: BTreeMap<u32, usize> = BTreeMap::new();
    for i in 0..n_dev {
        cur.take(pb::DEVICE)?;
        let user = get_u32(&devb, i * 16);
        let actual = get_u32(&devb, i * 16 + 4);
        let fd = get_u32(&devb, i * 16 + 8);
        let gpu = st.devs.index_of(actual).ok_or(libc::EINVAL)?;
        if user == 0
            || user_to_gpu.insert(user, gpu).is_some()
            || devices.iter().any(|d: &(usize, u32, u64)| d.0 == gpu)
        {
            return Err(libc::EINVAL);
        }
        let fh = res.open_of(caller.tgid, fd as i32)?;
        if st.opens.get(&fh) != Some(&super::state::Open::Render { gpu }) {
            return Err(libc::EINVAL);
        }
        devices.push((gpu, user, fh));
    }
    let mut bos = Vec::new();
    let mut vram = vec![0u64; st.devs.gpus.len()];
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let mut idrs = BTreeSet::new();
    for i in 0..n_bo {
        let r = cur.take(pb::BO)?;
        let b = &bob[i * pb::BO_BUCKET..(i + 1) * pb::BO_BUCKET];
        let gpu = *user_to_gpu.get(&get_u32(b, 32)).ok_or(libc::ENODEV)?;
        let (va, size, flags) = (get_u64(b, 0), get_u64(b, 8), get_u32(b, 36));
        let idr = get_u32(r, 8);
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
        if ranges.iter().any(|&(s, l)| s < va + size && va < s + l) {
            return Err(libc::EINVAL);
        }
        ranges.push((va, size));
        if !idrs.insert((gpu, idr)) {
            return Err(libc::ENOMEM);
        }
        if t == alloc::VRAM {
            vram[gpu] += size;
        }
        let mut mapped = BTreeSet::new();
        for j in 0..pb::MAX_GPU_INSTANCE {
            let id = get_u32(r, 12 + 4 * j);
            if id == 0 {
                break;
            }
            mapped.insert(*user_to_gpu.get(&id).ok_or(libc::EINVAL)?);
        }
        let user_addr = get_u64(r, 0);
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
    let mut queues = Vec::new();
    let mut events = Vec::new();
    let mut signal_handle = 0;
    let mut per_gpu: BTreeMap<(usize, bool), u32> = BTreeMap::new();
    for _ in 0..n_obj {
        let at = cur.off;
        let ty = get_u32(cur.take(4)?, 0);
        cur.off = at;
        match ty {
            pb::OBJ_QUEUE => {
                let r = cur.take(pb::QUEUE)?;
                let (ctl, mqd_size) = (get_u32(r, 108) as usize, get_u32(r, 112) as usize);
                if mqd_size != MQD_SIZE || ctl != 0 {
                    return Err(libc::EINVAL);
                }
                let m = cur.take(mqd_size)?;
                if get_u32(m, 0) != MQD_MAGIC || get_u32(m, 4) != 1 {
                    return Err(libc::EINVAL);
                }
                let gpu = *user_to_gpu.get(&get_u32(r, 64)).ok_or(libc::EINVAL)?;
                let qtype = get_u32(r, 68);
                let id = get_u32(r, 76);
                let ring_size = get_u64(r, 16);
                if qtype > uapi::queue_type::SDMA_XGMI
                    || id >= uapi::MAX_QUEUES_PER_PROCESS
                    || queues.iter().any(|q: &(u32, Queue, u64)| q.0 == id)
                    || ring_size > u32::MAX as u64
                    || (ring_size != 0 && !ring_size.is_power_of_two())
                    || get_u64(m, 24) != get_u64(r, 8)
                {
                    return Err(libc::EINVAL);
                }
                let q = Queue {
                    gpu,
                    qtype,
                    ring_base: get_u64(r, 8),
                    ring_size: ring_size as u32,
                    rptr_addr: get_u64(r, 24),
                    wptr_addr: get_u64(r, 32),
                    percent: get_u32(r, 84),
                    priority: get_u32(r, 80),
                    eop_addr: get_u64(r, 48),
                    eop_size: get_u32(r, 100) as u64,
                    ctx_addr: get_u64(r, 56),
                    ctx_size: get_u32(r, 104),
                    ctl_stack_size: get_u32(m, 40),
                    doorbell_index: id,
                    sdma_id: get_u32(r, 96),
                    rptr: get_u64(m, 8),
                    halted: get_u32(m, 36) != 0,
                };
                let cnt = per_gpu.entry((gpu, q.is_sdma())).or_insert(0);
                *cnt += 1;
                let g = &st.devs.gpus[gpu];
                let max = if q.is_sdma() {
                    g.max_sdma_queues
                } else {
                    g.max_cp_queues
                };
                if st.queues_on(gpu, q.is_sdma()) + *cnt > max {
                    return Err(libc::ENOMEM);
                }
                queues.push((id, q, get_u64(m, 16)));
            }
            pb::OBJ_EVENT => {
                let r = cur.take(pb::EVENT)?;
                let id = get_u32(r, 16);
                let etype = get_u32(r, 24);
                let signal = etype == uapi::event_type::SIGNAL || etype == uapi::event_type::DEBUG;
                if etype > 8
                    || p.events.contains_key(&id)
                    || events.iter().any(|e: &(u32, Event)| e.0 == id)
                    || (signal && id >= uapi::SIGNAL_EVENT_LIMIT)
                    || (!signal && id < uapi::FIRST_NONSIGNAL_EVENT_ID)
                {
                    return Err(libc::EINVAL);
                }
                let h = get_u64(r, 8);
                if h != 0 {
                    if signal_handle != 0 || !events.is_empty() {
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
                    signal_handle = h;
                }
                let mut data = [0u8; 32];
                data.copy_from_slice(&r[32..64]);
                events.push((
                    id,
                    Event {
                        etype,
                        auto_reset: get_u32(r, 20) != 0,
                        signaled: get_u32(r, 28) != 0,
                        node_id: 0,
                        trigger_data: 0,
                        data,
                    },
                ));
            }
            // SVM ranges are not emulated: no blob of ours carries them.
            _ => return Err(libc::EINVAL),
        }
    }
    if cur.off as u64 != priv_size {
        return Err(libc::EINVAL);
    }
    Ok((
        Plan {
            xnack,
            devices,
            bos,
            queues,
            events,
            signal_handle,
        },
        bob,
    ))
}

/// RESTORE: validate everything, then apply; an error while applying
/// (only memory exhaustion can happen then) undoes what was applied.
pub fn restore(
    st: &mut State,
    lead: u32,
    caller: &Caller,
    res: &dyn FdResolver,
    a: &mut Args,
) -> R<()> {
    let (plan, mut buckets) = plan_restore(st, lead, caller, res, a)?;
    let saved_ids: Vec<u32> = st.procs[&lead].pdds.iter().map(|d| d.user_id).collect();
    let r = apply(st, lead, &plan, &mut buckets);
    if let Err(e) = r {
        let p = st.procs.get_mut(&lead).unwrap();
        let bos = std::mem::take(&mut p.bos);
        p.queues.clear();
        for (id, _) in &plan.events {
            p.events.remove(id);
        }
        p.signal_page = None;
        for (d, id) in p.pdds.iter_mut().zip(saved_ids) {
            d.vm = None;
            d.user_id = id;
        }
        p.restore_pending = false;
        for (k, bo) in &bos {
            st.free_bo_memory(k.gpu, bo);
        }
        return Err(e);
    }
    user_write(caller.tid, a.u64(8), &buckets)
}

fn apply(st: &mut State, lead: u32, plan: &Plan, buckets: &mut [u8]) -> R<()> {
    {
        let p = st.procs.get_mut(&lead).unwrap();
        p.xnack = plan.xnack;
        p.restore_pending = true;
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
        p.bos.get_mut(&key).unwrap().mapped = b.mapped.clone();
        let bk = &mut buckets[i * pb::BO_BUCKET..(i + 1) * pb::BO_BUCKET];
        put_u64(
            bk,
            24,
            if b.flags & alloc::TYPE_MASK == alloc::USERPTR {
                0
            } else {
                offset
            },
        );
        put_u32(bk, 40, uapi::KFD_INVALID_FD);
        debug_assert_eq!(
            key,
            BoKey {
                gpu: b.gpu,
                idr: b.idr
            }
        );
    }
    for (id, q, wptr) in &plan.queues {
        let (gpu, idx) = (q.gpu, q.doorbell_index);
        kfd::add_queue(st, lead, *id, q.clone())?;
        let p = st.procs.get_mut(&lead).unwrap();
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

pub fn resume(st: &mut State, a: &Args, done: &mut Done) -> R<()> {
    let pid = a.u32(44);
    let p = st.procs.get_mut(&pid).ok_or(libc::ESRCH)?;
    if !p.restore_pending {
        return Err(libc::EINVAL);
    }
    p.restore_pending = false;
    let _ = done;
    Ok(())
}
