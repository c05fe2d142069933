//! What every packet handler of the CP model uses: words through the
//! queue's GPU VM, HSA signals as the CP writes them, the `amd_queue_t`
//! fields the CP reads, and the CP's queue errors.

use crate::device::asic::gpu_clock_counter;
use crate::device::state::{Done, Proc, Queue};

pub const PACKET: u64 = 64;
pub const COMPLETION_SIGNAL: u64 = 56;

/// `amd_queue_t` fields by their offset from `read_dispatch_id` (the read
/// pointer KFD was given, at byte 128 of the structure).
pub mod amd_queue {
    /// The structure itself (the kernel's queue ptr).
    pub const BASE: i64 = -128;
    /// COMPUTE_TMPRING_SIZE: WAVES (bits 11:0, per XCC) and WAVESIZE.
    pub const TMPRING_SIZE: u64 = 12;
    pub const SCRATCH_RESOURCE: u64 = 16;
    pub const SCRATCH_BACKING: u64 = 32;
    /// scratch_backing_memory_byte_size: one XCC's slice (ROCr 6 divides
    /// its allocation by the XCC count).
    pub const SCRATCH_BYTES: u64 = 40;
    pub const SCRATCH_PER_LANE: u64 = 48;
    pub const INACTIVE_SIGNAL: u64 = 64;
    /// `queue_properties`; bit 3 asks the CP for timestamps.
    pub const PROPERTIES: u64 = 52;
    pub const ENABLE_PROFILING: u32 = 1 << 3;
}

/// `amd_signal_t`: value, event mailbox pointer, event id.
const SIGNAL_VALUE: u64 = 8;
const SIGNAL_MAILBOX: u64 = 16;
const SIGNAL_EVENT_ID: u64 = 24;
/// `amd_signal_t`'s start and end timestamps, in the GPU clock's ticks.
const SIGNAL_START_TS: u64 = 32;
const SIGNAL_END_TS: u64 = 40;

/// The CP's queue error codes (the bits ROCr's queue error handler
/// decodes from `queue_inactive_signal`).
pub mod error {
    /// The dispatch needs more scratch than the queue has: the runtime
    /// grows it and stores 0 to resume the queue.
    pub const INSUFFICIENT_SCRATCH: i64 = 0x1;
    pub const INVALID_DIMENSION: i64 = 0x2;
    pub const INVALID_GROUP_MEMORY: i64 = 0x4;
    pub const INVALID_CODE: i64 = 0x8;
    pub const INVALID_PACKET_FORMAT: i64 = 0x20;
    pub const GROUP_TOO_LARGE: i64 = 0x40;
    pub const INVALID_VENDOR_PACKET: i64 = 0x100;
    pub const ILLEGAL_INSTRUCTION: i64 = 0x4000_0000;
    pub const TRAP: i64 = 0x8000_0000;
}

pub fn read_u64(p: &Proc, gpu: usize, va: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    p.gpu_read(gpu, va, &mut b).then(|| u64::from_le_bytes(b))
}

pub fn read_u32(p: &Proc, gpu: usize, va: u64) -> Option<u32> {
    let mut b = [0u8; 4];
    p.gpu_read(gpu, va, &mut b).then(|| u32::from_le_bytes(b))
}

pub fn write_u64(p: &Proc, gpu: usize, va: u64, v: u64) -> bool {
    p.gpu_write(gpu, va, &v.to_le_bytes())
}

/// A signal's value; None when unreachable.
pub fn signal_value(p: &Proc, gpu: usize, handle: u64) -> Option<i64> {
    read_u64(p, gpu, handle + SIGNAL_VALUE).map(|v| v as i64)
}

/// Writes `value` to a signal (or adds -1 when `decrement`), then, like the
/// CP's end-of-pipe write, its event id to its mailbox and the interrupt
/// that makes KFD signal the event.
pub fn signal(
    p: &mut Proc,
    gpu: usize,
    handle: u64,
    value: i64,
    decrement: bool,
    done: &mut Done,
) -> bool {
    let v = if decrement {
        match signal_value(p, gpu, handle) {
            Some(old) => old.wrapping_sub(1),
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
        let Some(id) = read_u32(p, gpu, handle + SIGNAL_EVENT_ID) else {
            return false;
        };
        if !write_u64(p, gpu, mailbox, id as u64) {
            return false;
        }
        p.trap(id, done);
    }
    true
}

/// Whether the runtime asked the CP for timestamps on the queue's
/// completion signals (ROCr does when profiling is enabled: HIP's timed events).
pub fn profiling(p: &Proc, q: &Queue) -> bool {
    read_u32(p, q.gpu, q.rptr_addr + amd_queue::PROPERTIES)
        .is_some_and(|v| v & amd_queue::ENABLE_PROFILING != 0)
}

/// Writes the GPU clock to a completion signal's start (or end) timestamp,
/// as the CP does for a packet of a profiling queue when it begins (ends) it.
pub fn stamp(p: &Proc, gpu: usize, handle: u64, end: bool) -> bool {
    let at = if end { SIGNAL_END_TS } else { SIGNAL_START_TS };
    write_u64(p, gpu, handle + at, gpu_clock_counter())
}

/// The queue's `queue_inactive_signal` (0: none).
pub fn inactive_signal(p: &Proc, q: &Queue) -> u64 {
    read_u64(p, q.gpu, q.rptr_addr + amd_queue::INACTIVE_SIGNAL).unwrap_or(0)
}

/// Raises queue error `code` on the queue's `queue_inactive_signal`, as
/// the CP does; false (logged) when the queue has none reachable.
pub fn raise(p: &mut Proc, id: u32, q: &Queue, code: i64, done: &mut Done) -> bool {
    let h = inactive_signal(p, q);
    if h != 0 && signal(p, q.gpu, h, code, false, done) {
        return true;
    }
    log::error!(
        "kfd-emu: process {} AQL queue {id}: no queue_inactive_signal reachable through the GPU \
         VM ({h:#x}) to report queue error {code:#x} on",
        p.lead
    );
    false
}

/// Stops queue `id` at packet `index`: logs `what` and raises queue error
/// `code` (0: stop without one, when the error went out another way).
pub fn stop(p: &mut Proc, id: u32, q: &Queue, index: u64, code: i64, what: &str, done: &mut Done) {
    let gpu_id = p.pdds[q.gpu].user_id;
    let raised = if code != 0 {
        format!("; queue error {code:#x} raised on its queue_inactive_signal")
    } else {
        String::new()
    };
    log::error!(
        "kfd-emu: process {} GPU {gpu_id:#x} AQL queue {id}: {what} at packet index {index}; \
         the queue is stopped{raised}",
        p.lead
    );
    if let Some(qs) = p.queues.get_mut(&id) {
        qs.halted = true;
        qs.aql = Default::default();
    }
    if code != 0 {
        raise(p, id, q, code, done);
    }
}

/// Ends queue `id` of a process that exits (its address space is gone):
/// no error, no event, an info line; KFD's release removes such queues
/// without a word, and the process' own release here removes this one.
pub fn end_quietly(p: &mut Proc, id: u32, q: &Queue, index: u64, what: &str) {
    log::info!(
        "kfd-emu: process {} GPU {:#x} AQL queue {id}: {what} at packet index {index}; the \
         queue ends with it",
        p.lead,
        p.pdds[q.gpu].user_id
    );
    if let Some(qs) = p.queues.get_mut(&id) {
        qs.halted = true;
        qs.aql = Default::default();
    }
}

/// What handling the packet at the read pointer came to.
pub enum Handled {
    /// Done: free its slot, move the read pointer, fire its completion
    /// signal; `invalidate` the GPU's instruction caches first.
    Complete { invalidate: bool },
    /// Not ready: look again later.
    Wait,
    /// Its waves run on the shader engine; the queue waits for their end.
    Launched(Box<crate::device::shader::Launch>),
    /// The queue stops with this CP queue error (0: none to raise).
    Error(i64, String),
}
