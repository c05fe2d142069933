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

use super::state::{Done, Proc, Queue};
use super::uapi::sdma::*;

/// Packets one queue may run per engine pass (keeps lock hold short).
const BUDGET: usize = 64;

fn ring_dword(p: &Proc, q: &Queue, pos: u64) -> Option<u32> {
    let off = pos % q.ring_size as u64;
    let mut b = [0u8; 4];
    p.read_va(q.ring_base + off, &mut b)
        .then(|| u32::from_le_bytes(b))
}

fn addr(lo: u32, hi: u32) -> u64 {
    lo as u64 | (hi as u64) << 32
}

enum Step {
    /// Executed; the packet had this many dwords.
    Done(u64),
    /// The packet is not completely written yet.
    Incomplete,
    /// Unknown packet or a fault: the queue halts, like a hung engine.
    Fault(&'static str),
}

fn exec(p: &Proc, q: &Queue, rptr: u64, avail_dw: u64, traps: &mut Vec<u32>) -> Step {
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
    let ok = match op {
        OP_NOP => true,
        OP_COPY => {
            let n = (dw[1] & 0x3f_ffff) as usize + 1;
            let mut buf = vec![0u8; n];
            p.read_va(addr(dw[3], dw[4]), &mut buf) && p.write_va(addr(dw[5], dw[6]), &buf)
        }
        OP_WRITE => {
            let data: Vec<u8> = dw[4..].iter().flat_map(|d| d.to_le_bytes()).collect();
            p.write_va(addr(dw[1], dw[2]), &data)
        }
        OP_FENCE => p.write_va(addr(dw[1], dw[2]), &dw[3].to_le_bytes()),
        OP_TRAP => {
            traps.push(dw[1] & 0x0fff_ffff);
            true
        }
        OP_CONST_FILL => {
            let n = (dw[4] & 0x3f_ffff) as usize + 1;
            let pat = dw[3].to_le_bytes();
            let buf: Vec<u8> = if h >> 30 == 0 {
                vec![pat[0]; n]
            } else {
                (0..n).map(|i| pat[i % 4]).collect()
            };
            p.write_va(addr(dw[1], dw[2]), &buf)
        }
        _ => false,
    };
    if ok {
        Step::Done(len)
    } else {
        Step::Fault("packet operand not in a BO of the process")
    }
}

/// Runs the process' SDMA queues once.  Returns whether any packet ran.
pub fn run(p: &mut Proc, done: &mut Done) -> bool {
    if p.evicted() {
        return false;
    }
    let mut worked = false;
    let ids: Vec<u32> = p
        .queues
        .iter()
        .filter(|(_, q)| q.is_sdma() && !q.halted && q.ring_size >= 16 && q.percent > 0)
        .map(|(&i, _)| i)
        .collect();
    for id in ids {
        let q = p.queues[&id].clone();
        let Some(wptr) = p.pdds[q.gpu]
            .doorbells
            .as_ref()
            .and_then(|d| d.read_u64(q.doorbell_index as u64 * 8))
        else {
            continue;
        };
        let mut rptr = q.rptr;
        let mut traps = Vec::new();
        let mut halted = None;
        if wptr < rptr || wptr % 4 != 0 {
            halted = Some("write pointer behind read pointer or unaligned");
        }
        let mut n = 0;
        while halted.is_none() && rptr < wptr && n < BUDGET {
            match exec(p, &q, rptr, (wptr - rptr) / 4, &mut traps) {
                Step::Done(len) => rptr += len * 4,
                Step::Incomplete => break,
                Step::Fault(why) => halted = Some(why),
            }
            n += 1;
        }
        if rptr != q.rptr {
            worked = true;
            p.write_va(q.rptr_addr, &rptr.to_le_bytes());
        }
        let qm = p.queues.get_mut(&id).unwrap();
        qm.rptr = rptr;
        if let Some(why) = halted {
            log::warn!(
                "kfd-emu: process {} SDMA queue {id}: {why} at rptr {rptr:#x}; queue halted",
                p.lead
            );
            p.queues.get_mut(&id).unwrap().halted = true;
        }
        for t in traps {
            p.trap(t, done);
        }
    }
    worked
}
