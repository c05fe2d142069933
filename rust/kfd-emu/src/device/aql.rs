//! The CP model: the AQL packet processor of compute queues.
//!
//! A compute queue of type COMPUTE_AQL holds 64-byte HSA packets; the
//! producer advances `write_dispatch_id` (the queue's write pointer, in
//! packets), writes the packet's header last and rings the doorbell.  The
//! CP reads packets from `read_dispatch_id` (the read pointer) while their
//! type is not INVALID, sets a finished packet's header to INVALID and
//! advances the read pointer.  Both pointers, the ring and the signals are
//! reached through the process' GPU VM.  A queue runs one packet at a time,
//! in order (which satisfies every packet's barrier bit).
//!
//! * BARRIER_AND / BARRIER_OR packets run here: the queue waits until all
//!   (any) of the non-null dependency signals are 0.
//! * KERNEL_DISPATCH packets are checked here (`kernel`) and their waves
//!   run on the shader engine (`shader`), outside the state lock; the
//!   queue waits until [`finish`] reports their end.  A dispatch whose
//!   waves an eviction saved (the queue's control stack, [`AqlState`]'s
//!   `saved`) is checked again when the queue runs and its waves are
//!   rebuilt from the queue's context save area (`shader::cwsr`).
//! * Vendor packets (`vendor`): PM4 indirect buffers (ACQUIRE_MEM) and
//!   BARRIER_VALUE.
//! * A finished packet's completion signal is decremented and its event
//!   raised, as the CP's end-of-pipe write does.  On a queue whose
//!   `amd_queue_t` asks for profiling, the signal's start and end
//!   timestamps get the GPU clock when the packet begins and ends.  Memory is coherent in
//!   the model, so acquire and release fences need no work.
//! * A packet the CP cannot run stops the queue: the daemon logs it and the
//!   process gets the CP's queue error on the queue's
//!   `queue_inactive_signal` (see `ring::error`), which ROCr reports through
//!   the queue's error callback; the completion signal is not touched.  A
//!   wave's memory fault is reported as KFD reports a GPU page fault (the
//!   process' memory events), and the queue stops.  A fault because the
//!   process' address space is gone (it exits, killed with kernels running)
//!   is no error: the dispatch and its queue end with an info line, as
//!   KFD's release removes a dying process' queues without a word.
//!
//! [`AqlState`]: super::state::AqlState

mod kernel;
mod ring;
mod vendor;

use gfx9::Target;

use super::shader::{CuLayout, JobKey, Launch, Outcome, SaveArea, SaveJob};
use super::state::{Done, Proc, Queue};
use super::uapi::queue_type;
use ring::{error, Handled, COMPLETION_SIGNAL, PACKET};

pub use kernel::VA_TOP;

const TYPE_VENDOR: u8 = 0;
const TYPE_INVALID: u8 = 1;
const TYPE_KERNEL_DISPATCH: u8 = 2;
const TYPE_BARRIER_AND: u8 = 3;
const TYPE_BARRIER_OR: u8 = 5;

/// What the CP model needs of a GPU: the shader ISA the engine runs on it
/// (None: one it does not run) and its CUs.
#[derive(Clone, Copy, Debug)]
pub struct Shaders {
    pub target: Option<Target>,
    /// The CUs of its XCCs, which queues' CU masks select from; its XCCs
    /// (`cus.xccs`), over which the CP spreads a dispatch's workgroups and
    /// splits the queue's scratch.
    pub cus: CuLayout,
}

/// Barrier packets: five dependency signals from byte 8.
const BARRIER_DEPS: u64 = 8;

/// Packets run per queue per pass.
const BUDGET: usize = 64;

/// What a pass did.
#[derive(Default)]
pub struct Pass {
    /// Packets were processed.
    pub worked: bool,
    /// A queue waits for memory to change (poll again soon).
    pub waiting: bool,
    /// Dispatches for the shader engine.
    pub launches: Vec<Launch>,
    /// GPU indices whose instruction caches ACQUIRE_MEM invalidated.
    pub invalidate: Vec<usize>,
}

/// Whether a barrier packet's dependencies are met: `None` when a signal
/// cannot be read.
fn barrier_ready(p: &Proc, gpu: usize, slot: u64, and: bool) -> Option<bool> {
    let mut any = false;
    let mut all = true;
    let mut deps = 0;
    for i in 0..5 {
        let h = ring::read_u64(p, gpu, slot + BARRIER_DEPS + 8 * i)?;
        if h == 0 {
            continue;
        }
        deps += 1;
        let zero = ring::signal_value(p, gpu, h)? == 0;
        any |= zero;
        all &= zero;
    }
    Some(if and { all } else { deps == 0 || any })
}

fn barrier(p: &Proc, q: &Queue, slot: u64, and: bool) -> Handled {
    match barrier_ready(p, q.gpu, slot, and) {
        None => Handled::Error(
            error::INVALID_PACKET_FORMAT,
            "a barrier's signal is not reachable".into(),
        ),
        Some(false) => Handled::Wait,
        Some(true) => Handled::Complete { invalidate: false },
    }
}

/// Handles the packet of type `ty` at `slot`, packet `index` of queue `id`.
fn handle(
    p: &mut Proc,
    id: u32,
    q: &Queue,
    gpu: Shaders,
    (ty, slot, index): (u8, u64, u64),
    done: &mut Done,
) -> Handled {
    if !q.aql.saved.is_empty() && ty != TYPE_KERNEL_DISPATCH {
        return Handled::Error(
            error::INVALID_PACKET_FORMAT,
            format!(
                "the queue's control stack holds a saved dispatch, but the packet at the read \
                 pointer is of type {ty}"
            ),
        );
    }
    match ty {
        // Reserved but not written yet.
        TYPE_INVALID => Handled::Wait,
        TYPE_BARRIER_AND | TYPE_BARRIER_OR => barrier(p, q, slot, ty == TYPE_BARRIER_AND),
        TYPE_KERNEL_DISPATCH => match kernel::prepare(p, id, q, gpu, (slot, index), done) {
            kernel::Prepared::Launch(mut l) => {
                if let Some(qs) = p.queues.get_mut(&id).filter(|qs| !qs.aql.saved.is_empty()) {
                    l.resume = Some((save_area(q), std::mem::take(&mut qs.aql.saved)));
                }
                Handled::Launched(l)
            }
            kernel::Prepared::ScratchWait => {
                if let Some(qs) = p.queues.get_mut(&id) {
                    qs.aql.scratch_wait = true;
                }
                Handled::Wait
            }
            kernel::Prepared::Error(code, what) => Handled::Error(code, what),
        },
        TYPE_VENDOR => vendor::handle(p, q, slot),
        t => Handled::Error(
            error::INVALID_PACKET_FORMAT,
            format!("packet of type {t} (agent dispatch or reserved): the CP model runs none"),
        ),
    }
}

/// The queue's context save area (XCC 0's; the others follow it), as
/// CREATE_QUEUE gave it.
pub fn save_area(q: &Queue) -> SaveArea {
    SaveArea {
        addr: q.ctx_addr,
        size: q.ctx_size,
        ctl_stack_size: q.ctl_stack_size,
    }
}

/// What the shader engine needs to save the waves of the dispatch queue
/// `id` of process `p` has in flight, on a GPU of `xccs` XCCs.
pub fn save_job(p: &Proc, id: u32, q: &Queue, xccs: u32) -> SaveJob {
    SaveJob {
        lead: p.lead,
        queue: id,
        area: save_area(q),
        xccs: xccs as u16,
        vm: p.gpu_range(q.gpu, 0, VA_TOP),
    }
}

/// The waves of queue `q`'s dispatch in flight are in its context save
/// area, `stacks` the control stack of each XCC: the dispatch waits at its
/// packet, and the queue rebuilds it when it runs again.
pub fn keep_saved(q: &mut Queue, stacks: Vec<Vec<u8>>) {
    q.aql.running = false;
    q.aql.saved = stacks;
    // Looked at again when the queue runs.
    q.aql.waiting = true;
}

/// The ring slot of packet `index`.
fn slot_of(q: &Queue, index: u64) -> u64 {
    q.ring_base + (index * PACKET) % q.ring_size as u64
}

/// Retires packet `index` at the read pointer: the slot is free again,
/// then the read pointer moves past it, then the completion signal fires.
fn complete(p: &mut Proc, id: u32, q: &Queue, index: u64, done: &mut Done) -> bool {
    let slot = slot_of(q, index);
    let completion = ring::read_u64(p, q.gpu, slot + COMPLETION_SIGNAL).unwrap_or(0);
    if completion != 0 && ring::profiling(p, q) {
        ring::stamp(p, q.gpu, completion, true);
    }
    let freed = p.gpu_write(q.gpu, slot, &u16::from(TYPE_INVALID).to_le_bytes());
    if !freed || !ring::write_u64(p, q.gpu, q.rptr_addr, index + 1) {
        let what = "the ring or read pointer is not writable";
        ring::stop(p, id, q, index, error::INVALID_PACKET_FORMAT, what, done);
        return false;
    }
    if completion != 0 && !ring::signal(p, q.gpu, completion, 0, true, done) {
        let what = "the completion signal is not reachable";
        ring::stop(p, id, q, index, error::INVALID_PACKET_FORMAT, what, done);
        return false;
    }
    true
}

/// Stamps the start of packet `index` at `slot` on its completion signal,
/// once, when the queue profiles.
fn stamp_start(p: &mut Proc, id: u32, q: &Queue, slot: u64, index: u64) {
    let Some(qs) = p.queues.get_mut(&id) else {
        return;
    };
    if qs.aql.started == Some(index) {
        return;
    }
    qs.aql.started = Some(index);
    let completion = ring::read_u64(p, q.gpu, slot + COMPLETION_SIGNAL).unwrap_or(0);
    if completion != 0 && ring::profiling(p, q) {
        ring::stamp(p, q.gpu, completion, false);
    }
}

/// Whether a queue waiting for scratch may go on: the runtime stored 0 to
/// its `queue_inactive_signal`.
fn scratch_granted(p: &Proc, q: &Queue) -> bool {
    let h = ring::inactive_signal(p, q);
    h != 0 && ring::signal_value(p, q.gpu, h) == Some(0)
}

/// Runs queue `id` as far as it goes; returns whether it waits.
fn run_queue(
    p: &mut Proc,
    id: u32,
    q: &Queue,
    gpu: Shaders,
    out: &mut Pass,
    done: &mut Done,
) -> bool {
    for _ in 0..BUDGET {
        let (Some(wptr), Some(rptr)) = (
            ring::read_u64(p, q.gpu, q.wptr_addr),
            ring::read_u64(p, q.gpu, q.rptr_addr),
        ) else {
            let what = "the read or write pointer is not reachable";
            ring::stop(p, id, q, 0, error::INVALID_PACKET_FORMAT, what, done);
            return false;
        };
        if rptr >= wptr {
            return false;
        }
        let slot = slot_of(q, rptr);
        let mut hdr = [0u8; 2];
        let handled = if p.gpu_read(q.gpu, slot, &mut hdr) {
            if hdr[0] != TYPE_INVALID {
                stamp_start(p, id, q, slot, rptr);
            }
            handle(p, id, q, gpu, (hdr[0], slot, rptr), done)
        } else {
            Handled::Error(
                error::INVALID_PACKET_FORMAT,
                "the ring is not reachable".into(),
            )
        };
        match handled {
            Handled::Wait => return true,
            Handled::Error(code, what) => {
                ring::stop(p, id, q, rptr, code, &what, done);
                return false;
            }
            Handled::Launched(l) => {
                if let Some(qs) = p.queues.get_mut(&id) {
                    qs.aql.running = true;
                }
                out.launches.push(*l);
                out.worked = true;
                return false;
            }
            Handled::Complete { invalidate } => {
                if invalidate {
                    out.invalidate.push(q.gpu);
                }
                if !complete(p, id, q, rptr, done) {
                    return false;
                }
                out.worked = true;
            }
        }
    }
    false
}

/// Runs the process' AQL queues as far as they go; `gpus` gives each
/// GPU's shader ISA and XCCs.
pub fn pass(p: &mut Proc, gpus: &[Shaders], done: &mut Done) -> Pass {
    let mut out = Pass::default();
    if p.evicted() {
        return out;
    }
    let ids: Vec<u32> = p
        .queues
        .iter()
        .filter(|(_, q)| {
            q.qtype == queue_type::COMPUTE_AQL
                && !q.halted
                && !q.aql.running
                && q.is_mappable()
                && q.ring_size >= PACKET as u32
        })
        .map(|(&id, _)| id)
        .collect();
    for id in ids {
        let q = p.queues[&id].clone();
        let doorbell = p.pdds[q.gpu]
            .doorbells
            .as_ref()
            .and_then(|d| d.read_u64(q.doorbell_index as u64 * 8));
        if doorbell == q.aql.doorbell && !q.aql.waiting {
            continue;
        }
        let waiting = if q.aql.scratch_wait && !scratch_granted(p, &q) {
            true
        } else {
            if let Some(qs) = p.queues.get_mut(&id) {
                qs.aql.scratch_wait = false;
            }
            let gpu = gpus.get(q.gpu).copied().unwrap_or(Shaders {
                target: None,
                cus: CuLayout::default(),
            });
            run_queue(p, id, &q, gpu, &mut out, done)
        };
        if let Some(qs) = p.queues.get_mut(&id) {
            qs.aql.doorbell = doorbell;
            qs.aql.waiting = waiting && !qs.halted;
        }
        out.waiting |= waiting;
    }
    out
}

/// The shader engine finished dispatch `key` with `outcome`: the packet
/// completes, or the queue stops with the error the CP or KFD reports.
pub fn finish(p: &mut Proc, key: &JobKey, outcome: &Outcome, done: &mut Done) {
    let Some(q) = p.queues.get(&key.queue).filter(|q| q.aql.running).cloned() else {
        return;
    };
    if let Some(qs) = p.queues.get_mut(&key.queue) {
        qs.aql.running = false;
        // Looked at again by the next pass.
        qs.aql.waiting = true;
    }
    let what = format!(
        "kernel dispatch of kernel object {:#x}: {outcome}",
        key.object
    );
    match outcome {
        Outcome::Done { .. } => {
            complete(p, key.queue, &q, key.index, done);
        }
        Outcome::Fault { fault, .. } => {
            p.vm_fault(q.gpu, fault.addr, done);
            ring::stop(p, key.queue, &q, key.index, 0, &what, done);
        }
        Outcome::Illegal { .. } => {
            let code = error::ILLEGAL_INSTRUCTION;
            ring::stop(p, key.queue, &q, key.index, code, &what, done);
        }
        Outcome::Trap { .. } => ring::stop(p, key.queue, &q, key.index, error::TRAP, &what, done),
        Outcome::Gone { .. } => ring::end_quietly(p, key.queue, &q, key.index, &what),
        // The CP cannot relaunch the saved waves: the dispatch is lost.
        Outcome::Restore { .. } => {
            let code = error::INVALID_PACKET_FORMAT;
            ring::stop(p, key.queue, &q, key.index, code, &what, done);
        }
    }
}
