//! The emulated SDMA engine: executes SDMA v4 packets from user-mode ring
//! buffers.  Ring, rptr write-back and packet operands are GPU VAs,
//! resolved through the owning process' BOs (VRAM/GTT through the
//! daemon's memfd mappings, USERPTR through `process_vm_*`).
//!
//! Packet dword layouts (SDMA v4, little endian):
//! * header: op bits 7..0, sub-op bits 15..8;
//! * NOP: header bits 29..16 = dwords that follow;
//! * COPY_LINEAR (7 dw): count (bytes - 1, bits 21..0), parameter,
//!   src lo/hi, dst lo/hi;
//! * WRITE_LINEAR (4 + n dw): dst lo/hi, count (dwords - 1, bits 19..0),
//!   then the data;
//! * FENCE (4 dw): addr lo/hi, data (one dword written);
//! * TRAP (2 dw): int_context bits 27..0;
//! * CONST_FILL (5 dw): header fillsize bits 31..30 (0 byte, 2 dword),
//!   dst lo/hi, data, count (bytes - 1, bits 21..0).
//!
//! The bytes move outside the global state lock, so a large copy does not
//! stall the ioctls of other processes.  A pass over one process has three
//! steps: [`plan`] (under the lock) reads the doorbells and rings and
//! resolves every packet operand to a [`Span`], which keeps the memory
//! alive; [`execute`] (lock released) runs the packets in ring order;
//! [`commit`] (under the lock again) advances and writes back the read
//! pointers, halts faulted queues and delivers the TRAPs.  While a
//! process' packets execute, `State::sdma_busy` names it, and the ioctls
//! that would free its memory, change its queues or checkpoint it wait for
//! the end of the pass, as KFD waits for a queue to be preempted.

use super::state::{Done, Proc, Queue, Span};
use super::uapi::sdma::*;

/// Packets one queue may run per engine pass.
const BUDGET: usize = 64;

const OPERAND_FAULT: &str = "packet operand not in a BO of the process";

fn ring_dword(p: &Proc, q: &Queue, pos: u64) -> Option<u32> {
    let off = pos % q.ring_size as u64;
    let mut b = [0u8; 4];
    p.read_va(q.ring_base + off, &mut b)
        .then(|| u32::from_le_bytes(b))
}

fn addr(lo: u32, hi: u32) -> u64 {
    lo as u64 | (hi as u64) << 32
}

/// What one packet does, its operands resolved.
enum Op {
    Nop,
    Copy {
        src: Span,
        dst: Span,
        n: usize,
    },
    Write {
        dst: Span,
        data: Vec<u8>,
    },
    Fill {
        dst: Span,
        pat: [u8; 4],
        bytewise: bool,
        n: usize,
    },
    Trap(u32),
}

impl Op {
    /// Moves the bytes; false on a fault (a USERPTR page gone).
    fn run(self, traps: &mut Vec<u32>) -> bool {
        match self {
            Op::Nop => true,
            Op::Copy { src, dst, n } => dst.copy_from(&src, n),
            Op::Write { dst, data } => dst.write(&data),
            Op::Fill {
                dst,
                pat,
                bytewise,
                n,
            } => {
                let buf: Vec<u8> = if bytewise {
                    vec![pat[0]; n]
                } else {
                    (0..n).map(|i| pat[i % 4]).collect()
                };
                dst.write(&buf)
            }
            Op::Trap(ctx) => {
                traps.push(ctx);
                true
            }
        }
    }
}

enum Step {
    /// A whole packet of this many dwords.
    Packet(Op, u64),
    /// The packet is not completely written yet.
    Incomplete,
    /// Unknown packet or a fault: the queue halts, like a hung engine.
    Fault(&'static str),
}

fn decode(p: &Proc, q: &Queue, rptr: u64, avail_dw: u64) -> Step {
    let Some(h) = ring_dword(p, q, rptr) else {
        return Step::Fault("ring not readable");
    };
    let (op, sub) = (h & 0xff, (h >> 8) & 0xff);
    let len = match (op, sub) {
        (OP_NOP, _) => 1 + ((h >> 16) & 0x3fff) as u64,
        (OP_COPY, SUBOP_LINEAR) => 7,
        (OP_WRITE, SUBOP_LINEAR) => {
            if avail_dw < 4 {
                return Step::Incomplete;
            }
            let Some(c) = ring_dword(p, q, rptr + 12) else {
                return Step::Fault("ring not readable");
            };
            4 + (c & 0xfffff) as u64 + 1
        }
        (OP_FENCE, _) => 4,
        (OP_TRAP, _) => 2,
        (OP_CONST_FILL, _) => 5,
        _ => return Step::Fault("unsupported SDMA packet"),
    };
    if len > avail_dw {
        return Step::Incomplete;
    }
    if len * 4 > q.ring_size as u64 {
        return Step::Fault("packet larger than the ring");
    }
    let mut dw = Vec::with_capacity(len as usize);
    for i in 0..len {
        match ring_dword(p, q, rptr + i * 4) {
            Some(d) => dw.push(d),
            None => return Step::Fault("ring not readable"),
        }
    }
    let span = |lo, hi, n: usize| p.span_at(addr(lo, hi), n as u64);
    let op = match op {
        OP_NOP => Some(Op::Nop),
        OP_COPY => {
            let n = (dw[1] & 0x3f_ffff) as usize + 1;
            span(dw[3], dw[4], n)
                .zip(span(dw[5], dw[6], n))
                .map(|(src, dst)| Op::Copy { src, dst, n })
        }
        OP_WRITE => {
            let data: Vec<u8> = dw[4..].iter().flat_map(|d| d.to_le_bytes()).collect();
            span(dw[1], dw[2], data.len()).map(|dst| Op::Write { dst, data })
        }
        OP_FENCE => span(dw[1], dw[2], 4).map(|dst| Op::Write {
            dst,
            data: dw[3].to_le_bytes().to_vec(),
        }),
        OP_TRAP => Some(Op::Trap(dw[1] & 0x0fff_ffff)),
        OP_CONST_FILL => {
            let n = (dw[4] & 0x3f_ffff) as usize + 1;
            span(dw[1], dw[2], n).map(|dst| Op::Fill {
                dst,
                pat: dw[3].to_le_bytes(),
                bytewise: h >> 30 == 0,
                n,
            })
        }
        _ => None,
    };
    match op {
        Some(op) => Step::Packet(op, len),
        None => Step::Fault(OPERAND_FAULT),
    }
}

/// The packets of one queue planned for a pass.
pub struct QueueWork {
    id: u32,
    /// The queue's read pointer when planned.
    start: u64,
    /// Each packet with its size in bytes.
    packets: Vec<(Op, u64)>,
    /// Why the queue halts after these packets, if it does.
    halt: Option<&'static str>,
}

/// What a pass did to one queue.
pub struct QueueDone {
    id: u32,
    start: u64,
    rptr: u64,
    halt: Option<&'static str>,
    traps: Vec<u32>,
}

/// Reads the rings of the process' runnable SDMA queues and resolves
/// their packets (under the state lock).  Empty when there is nothing to
/// do.
pub fn plan(p: &Proc) -> Vec<QueueWork> {
    if p.evicted() {
        return Vec::new();
    }
    let mut work = Vec::new();
    for (&id, q) in p
        .queues
        .iter()
        .filter(|(_, q)| q.is_sdma() && !q.halted && q.ring_size >= 16 && q.percent > 0)
    {
        let Some(wptr) = p.pdds[q.gpu]
            .doorbells
            .as_ref()
            .and_then(|d| d.read_u64(q.doorbell_index as u64 * 8))
        else {
            continue;
        };
        let mut w = QueueWork {
            id,
            start: q.rptr,
            packets: Vec::new(),
            halt: None,
        };
        if wptr < q.rptr || wptr % 4 != 0 {
            w.halt = Some("write pointer behind read pointer or unaligned");
        }
        let mut rptr = q.rptr;
        while w.halt.is_none() && rptr < wptr && w.packets.len() < BUDGET {
            match decode(p, q, rptr, (wptr - rptr) / 4) {
                Step::Packet(op, len) => {
                    w.packets.push((op, len * 4));
                    rptr += len * 4;
                }
                Step::Incomplete => break,
                Step::Fault(why) => w.halt = Some(why),
            }
        }
        if !w.packets.is_empty() || w.halt.is_some() {
            work.push(w);
        }
    }
    work
}

/// Runs planned packets in ring order (without the state lock).
pub fn execute(work: Vec<QueueWork>) -> Vec<QueueDone> {
    work.into_iter()
        .map(|w| {
            let mut d = QueueDone {
                id: w.id,
                start: w.start,
                rptr: w.start,
                halt: None,
                traps: Vec::new(),
            };
            for (op, bytes) in w.packets {
                if !op.run(&mut d.traps) {
                    d.halt = Some(OPERAND_FAULT);
                    return d;
                }
                d.rptr += bytes;
            }
            d.halt = w.halt;
            d
        })
        .collect()
}

/// Publishes a pass (under the state lock): read pointers, halts, TRAPs.
/// Returns whether any packet ran.
pub fn commit(p: &mut Proc, done_queues: Vec<QueueDone>, done: &mut Done) -> bool {
    let mut worked = false;
    for d in done_queues {
        let Some(q) = p.queues.get_mut(&d.id) else {
            continue;
        };
        if q.rptr != d.start {
            // Replaced while the packets ran (cannot happen: the ioctls
            // that touch queues wait for the pass).
            continue;
        }
        q.rptr = d.rptr;
        let rptr_addr = q.rptr_addr;
        if let Some(why) = d.halt {
            q.halted = true;
            log::warn!(
                "kfd-emu: process {} SDMA queue {}: {why} at rptr {:#x}; queue halted",
                p.lead,
                d.id,
                d.rptr
            );
        }
        if d.rptr != d.start {
            worked = true;
            p.write_va(rptr_addr, &d.rptr.to_le_bytes());
        }
        for t in d.traps {
            p.trap(t, done);
        }
    }
    worked
}
