//! The AQL packet processor of compute queues: the part of the CP that
//! needs no shader engine.
//!
//! A compute queue of type COMPUTE_AQL holds 64-byte HSA packets; the
//! producer advances `write_dispatch_id` (the queue's write pointer, in
//! packets), writes the packet's header last and rings the doorbell.  The
//! CP reads packets from `read_dispatch_id` (the read pointer) while their
//! type is not INVALID, sets a finished packet's header to INVALID and
//! advances the read pointer.  Both pointers, the ring and the signals are
//! reached through the process' GPU VM.
//!
//! * BARRIER_AND / BARRIER_OR packets run here: the queue waits until all
//!   (any) of the non-null dependency signals are 0, then the completion
//!   signal is decremented and its event raised, as the CP does.
//! * Every other packet (kernel and agent dispatches, vendor packets)
//!   needs shader code the emulated GPU cannot run.  The queue stops at
//!   it, the daemon logs an error naming the packet, and the process gets
//!   the CP's queue error for a packet it cannot process, "invalid packet
//!   format" (0x20), stored in the queue's `queue_inactive_signal` with its
//!   event raised.  ROCr reports that as
//!   HSA_STATUS_ERROR_INVALID_PACKET_FORMAT through the queue's error
//!   callback (HIP aborts with it) and suspends the queue.  The packet's
//!   completion signal is not touched, as on hardware.

use super::state::{Done, Proc, Queue};
use super::uapi::queue_type;

const PACKET: u64 = 64;
const TYPE_VENDOR: u8 = 0;
const TYPE_INVALID: u8 = 1;
const TYPE_KERNEL_DISPATCH: u8 = 2;
const TYPE_BARRIER_AND: u8 = 3;
const TYPE_AGENT_DISPATCH: u8 = 4;
const TYPE_BARRIER_OR: u8 = 5;

/// Barrier packets: five dependency signals from byte 8, the completion
/// signal at 56.
const BARRIER_DEPS: u64 = 8;
const COMPLETION_SIGNAL: u64 = 56;

/// `amd_queue_t`: `queue_inactive_signal` lies 64 bytes after
/// `read_dispatch_id` (the read pointer KFD was given).
const INACTIVE_SIGNAL_FROM_RPTR: u64 = 64;

/// `amd_signal_t`: value, event mailbox pointer, event id.
const SIGNAL_VALUE: u64 = 8;
const SIGNAL_MAILBOX: u64 = 16;
const SIGNAL_EVENT_ID: u64 = 24;

/// The CP's queue error code for a packet it cannot process.
pub const ERROR_INVALID_PACKET_FORMAT: i64 = 0x20;

/// Packets run per queue per pass.
const BUDGET: usize = 64;

/// What the packet processor keeps of a queue between passes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AqlState {
    /// The doorbell value at the last look; the queue is looked at again
    /// when it changes, or while `waiting`.
    pub doorbell: Option<u64>,
    /// A packet is pending: its header is not written yet, or a barrier
    /// waits for its dependencies.
    pub waiting: bool,
}

/// What a pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    /// Packets were processed.
    pub worked: bool,
    /// A queue waits for memory to change (poll again soon).
    pub waiting: bool,
}

fn read_u64(p: &Proc, gpu: usize, va: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    p.gpu_read(gpu, va, &mut b).then(|| u64::from_le_bytes(b))
}

fn write_u64(p: &Proc, gpu: usize, va: u64, v: u64) -> bool {
    p.gpu_write(gpu, va, &v.to_le_bytes())
}

/// Writes `value` to a signal (or adds -1 when `decrement`), then, like the
/// CP's end-of-pipe write, its event id to its mailbox and the interrupt
/// that makes KFD signal the event.
fn signal(
    p: &mut Proc,
    gpu: usize,
    handle: u64,
    value: i64,
    decrement: bool,
    done: &mut Done,
) -> bool {
    let v = if decrement {
        match read_u64(p, gpu, handle + SIGNAL_VALUE) {
            Some(old) => (old as i64).wrapping_sub(1),
            None => return false,
        }
    } else {
        value
    };
    if !write_u64(p, gpu, handle + SIGNAL_VALUE, v as u64) {
        return false;
    }
    let Some(mailbox) = read_u64(p, gpu, handle + SIGNAL_MAILBOX) else {
        return false;
    };
    if mailbox != 0 {
        let mut id = [0u8; 4];
        if !p.gpu_read(gpu, handle + SIGNAL_EVENT_ID, &mut id) {
            return false;
        }
        let id = u32::from_le_bytes(id);
        if !write_u64(p, gpu, mailbox, id as u64) {
            return false;
        }
        p.trap(id, done);
    }
    true
}

fn type_name(t: u8) -> &'static str {
    match t {
        TYPE_VENDOR => "vendor-specific",
        TYPE_KERNEL_DISPATCH => "kernel dispatch",
        TYPE_AGENT_DISPATCH => "agent dispatch",
        _ => "reserved-type",
    }
}

/// Whether a barrier packet's dependencies are met: `None` when a signal
/// cannot be read.
fn barrier_ready(p: &Proc, gpu: usize, slot: u64, and: bool) -> Option<bool> {
    let mut any = false;
    let mut all = true;
    let mut deps = 0;
    for i in 0..5 {
        let h = read_u64(p, gpu, slot + BARRIER_DEPS + 8 * i)?;
        if h == 0 {
            continue;
        }
        deps += 1;
        let zero = read_u64(p, gpu, h + SIGNAL_VALUE)? == 0;
        any |= zero;
        all &= zero;
    }
    Some(if and { all } else { deps == 0 || any })
}

/// Stops queue `id` at the packet at `index` and raises the CP's queue
/// error.
fn fault(p: &mut Proc, id: u32, q: &Queue, gpu_id: u32, index: u64, what: &str, done: &mut Done) {
    log::error!(
        "kfd-emu: process {} GPU {gpu_id:#x} AQL queue {id}: {what} at packet index {index}; the \
         queue is stopped and the CP's queue error 'invalid packet format' ({:#x}) raised on its \
         queue_inactive_signal",
        p.lead,
        ERROR_INVALID_PACKET_FORMAT
    );
    if let Some(qs) = p.queues.get_mut(&id) {
        qs.halted = true;
        qs.aql.waiting = false;
    }
    match read_u64(p, q.gpu, q.rptr_addr + INACTIVE_SIGNAL_FROM_RPTR) {
        Some(h) if h != 0 => {
            if !signal(p, q.gpu, h, ERROR_INVALID_PACKET_FORMAT, false, done) {
                log::error!(
                    "kfd-emu: process {} AQL queue {id}: its queue_inactive_signal {h:#x} is not \
                     reachable through the GPU VM",
                    p.lead
                );
            }
        }
        _ => log::error!(
            "kfd-emu: process {} AQL queue {id}: no queue_inactive_signal to report it on",
            p.lead
        ),
    }
}

/// Runs the process' AQL queues as far as they go.
pub fn pass(p: &mut Proc, done: &mut Done) -> Pass {
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
                && q.percent > 0
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
        let gpu_id = p.pdds[q.gpu].user_id;
        let mut waiting = false;
        for _ in 0..BUDGET {
            let (Some(wptr), Some(rptr)) = (
                read_u64(p, q.gpu, q.wptr_addr),
                read_u64(p, q.gpu, q.rptr_addr),
            ) else {
                fault(
                    p,
                    id,
                    &q,
                    gpu_id,
                    0,
                    "the read or write pointer is not reachable",
                    done,
                );
                break;
            };
            if rptr >= wptr {
                break;
            }
            let slot = q.ring_base + (rptr * PACKET) % q.ring_size as u64;
            let mut hdr = [0u8; 2];
            if !p.gpu_read(q.gpu, slot, &mut hdr) {
                fault(p, id, &q, gpu_id, rptr, "the ring is not reachable", done);
                break;
            }
            let ty = hdr[0];
            let ready = match ty {
                TYPE_INVALID => {
                    // Reserved but not written yet.
                    waiting = true;
                    break;
                }
                TYPE_BARRIER_AND | TYPE_BARRIER_OR => {
                    barrier_ready(p, q.gpu, slot, ty == TYPE_BARRIER_AND)
                }
                _ => {
                    let what = format!(
                        "{} packet: the emulated GPU runs no shader code",
                        type_name(ty)
                    );
                    fault(p, id, &q, gpu_id, rptr, &what, done);
                    break;
                }
            };
            match ready {
                None => {
                    fault(
                        p,
                        id,
                        &q,
                        gpu_id,
                        rptr,
                        "a barrier's signal is not reachable",
                        done,
                    );
                    break;
                }
                Some(false) => {
                    waiting = true;
                    break;
                }
                Some(true) => {}
            }
            let completion = read_u64(p, q.gpu, slot + COMPLETION_SIGNAL).unwrap_or(0);
            // The slot is free again, then the read pointer moves past it,
            // then the completion signal fires.
            let freed = p.gpu_write(q.gpu, slot, &u16::from(TYPE_INVALID).to_le_bytes());
            if !freed || !write_u64(p, q.gpu, q.rptr_addr, rptr + 1) {
                fault(
                    p,
                    id,
                    &q,
                    gpu_id,
                    rptr,
                    "the ring or read pointer is not writable",
                    done,
                );
                break;
            }
            if completion != 0 && !signal(p, q.gpu, completion, 0, true, done) {
                fault(
                    p,
                    id,
                    &q,
                    gpu_id,
                    rptr,
                    "the completion signal is not reachable",
                    done,
                );
                break;
            }
            out.worked = true;
        }
        if let Some(qs) = p.queues.get_mut(&id) {
            qs.aql.doorbell = doorbell;
            qs.aql.waiting = waiting && !qs.halted;
        }
        out.waiting |= waiting;
    }
    out
}
