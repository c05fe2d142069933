//! The AMD vendor-specific AQL packets ROCr submits (`AmdFormat` at byte
//! 2): a PM4 indirect buffer (how ROCr has the CP invalidate caches with
//! ACQUIRE_MEM after it writes a code object) and BARRIER_VALUE (waits
//! until a signal's value, masked, compares true).

use super::ring::{self, error, Handled};
use crate::device::state::{Proc, Queue};

const FORMAT_PM4_IB: u8 = 1;
const FORMAT_BARRIER_VALUE: u8 = 2;

/// PM4 type-3 opcodes the CP model runs.
const IT_NOP: u32 = 0x10;
const IT_INDIRECT_BUFFER: u32 = 0x3f;
const IT_ACQUIRE_MEM: u32 = 0x58;
/// The longest indirect buffer the model reads, in dwords.
const IB_MAX_DWORDS: usize = 1024;

fn word(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn bad(what: String) -> Handled {
    Handled::Error(error::INVALID_VENDOR_PACKET, what)
}

/// Handles the vendor packet at `slot`.
pub fn handle(p: &Proc, q: &Queue, slot: u64) -> Handled {
    let mut b = [0u8; 64];
    if !p.gpu_read(q.gpu, slot, &mut b) {
        return bad("vendor packet: the ring is unreachable".into());
    }
    match b[2] {
        FORMAT_PM4_IB => pm4_ib(p, q, &b),
        FORMAT_BARRIER_VALUE => barrier_value(p, q, &b),
        f => bad(format!(
            "vendor packet of AMD format {f}, which the CP model does not run"
        )),
    }
}

/// The packet's INDIRECT_BUFFER command (dwords 1-4), then the buffer.
fn pm4_ib(p: &Proc, q: &Queue, b: &[u8; 64]) -> Handled {
    let hdr = word(b, 4);
    if hdr >> 30 != 3 || hdr >> 8 & 0xff != IT_INDIRECT_BUFFER {
        return bad(format!("PM4 vendor packet: {hdr:#x} is no INDIRECT_BUFFER"));
    }
    let base = (word(b, 8) & !3) as u64 | ((word(b, 12) & 0xffff) as u64) << 32;
    let dwords = (word(b, 16) & 0xf_ffff) as usize;
    if dwords > IB_MAX_DWORDS {
        return bad(format!("PM4 indirect buffer at {base:#x}: {dwords} dwords"));
    }
    let mut ib = vec![0u8; dwords * 4];
    if !p.gpu_read(q.gpu, base, &mut ib) {
        return bad(format!(
            "PM4 indirect buffer at {base:#x} is not in the GPU VM"
        ));
    }
    run_ib(&ib, base)
}

/// Runs the type-3 packets of an indirect buffer.
fn run_ib(ib: &[u8], base: u64) -> Handled {
    let n = ib.len() / 4;
    let mut at = 0;
    let mut invalidate = false;
    while at < n {
        let hdr = word(ib, 4 * at);
        let (ty, body, op) = (
            hdr >> 30,
            (hdr >> 16 & 0x3fff) as usize + 1,
            hdr >> 8 & 0xff,
        );
        match (ty, op) {
            (2, _) => {
                at += 1;
                continue;
            }
            (3, IT_NOP) => {}
            (3, IT_ACQUIRE_MEM) => invalidate = true,
            _ => {
                return bad(format!(
                    "PM4 indirect buffer at {base:#x}: packet {hdr:#x} (type {ty}, opcode \
                     {op:#x}) is not one the CP model runs"
                ))
            }
        }
        at += 1 + body;
    }
    Handled::Complete { invalidate }
}

/// `hsa_amd_barrier_value_packet_t`: signal at 8, value 16, mask 24,
/// condition 32 (EQ, NE, LT, GTE).
fn barrier_value(p: &Proc, q: &Queue, b: &[u8; 64]) -> Handled {
    let q64 = |at: usize| word(b, at) as u64 | (word(b, at + 4) as u64) << 32;
    let (sig, value, mask, cond) = (q64(8), q64(16) as i64, q64(24) as i64, word(b, 32));
    let Some(v) = ring::signal_value(p, q.gpu, sig) else {
        return bad(format!(
            "barrier-value packet: signal {sig:#x} is not in the GPU VM"
        ));
    };
    let v = v & mask;
    let met = match cond {
        0 => v == value,
        1 => v != value,
        2 => v < value,
        3 => v >= value,
        c => return bad(format!("barrier-value packet: condition {c}")),
    };
    if met {
        Handled::Complete { invalidate: false }
    } else {
        Handled::Wait
    }
}
