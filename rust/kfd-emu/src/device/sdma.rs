//! The emulated SDMA engine: executes SDMA v4 packets (the packet set of
//! GFX9: gfx908, gfx90a, gfx942) from user-mode ring buffers.  Everything
//! the engine touches, its ring and read pointer included, is a GPU VA
//! reached through the VM of the queue's GPU (`vm`): a BO of the process
//! mapped there, or a GPU page fault.
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
//! resolves every packet operand to a [`GpuRange`], which keeps the memory
//! alive; [`execute`] (lock released) runs the packets in ring order;
//! [`commit`] (under the lock again) advances and writes back the read
//! pointers, halts faulted queues and delivers the TRAPs.  While a
//! process' packets execute, `State::sdma_busy` names it, and the ioctls
//! that would free its memory, change its queues or checkpoint it wait for
//! the end of the pass, as KFD waits for a queue to be preempted.

use super::state::{Done, Proc, Queue};
use super::uapi::sdma::*;
use super::vm::{Fault, GpuRange};

/// Packets one queue may run per engine pass.
const BUDGET: usize = 64;

/// Ring bytes read at a time.
const RING_CHUNK: u64 = 64 << 10;

/// Why a queue stops for good: the engine hangs on the packet (real
/// hardware would need a queue reset), and the log says why.
#[derive(Debug)]
enum Halt {
    /// A packet the engine does not know or cannot execute as written.
    Bad(String),
    /// A memory access faulted (`what` names the operand).
    Fault { what: &'static str, fault: Fault },
}

impl std::fmt::Display for Halt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Halt::Bad(s) => f.write_str(s),
            Halt::Fault { what, fault } => write!(f, "{what}: {fault}"),
        }
    }
}

fn fault(what: &'static str) -> impl FnOnce(Fault) -> Halt {
    move |fault| Halt::Fault { what, fault }
}

fn addr(lo: u32, hi: u32) -> u64 {
    lo as u64 | (hi as u64) << 32
}

/// Reads a queue's ring through the GPU's VM, a chunk at a time.
struct Ring {
    range: GpuRange,
    size: u64,
    /// Ring position (bytes, monotonic) of `buf[0]`.
    base: u64,
    buf: Vec<u32>,
}

impl Ring {
    /// The dword at monotonic byte position `pos`; reads up to `limit`
    /// (the write pointer) ahead.
    fn dw(&mut self, pos: u64, limit: u64) -> Result<u32, Halt> {
        let have = self.base + self.buf.len() as u64 * 4;
        if pos < self.base || pos >= have {
            self.base = pos;
            self.buf.clear();
            let bytes = match self.read(pos, (limit - pos).min(RING_CHUNK)) {
                Ok(b) => b,
                // The fault may lie past this dword: fetch it alone.
                Err(_) => self.read(pos, 4)?,
            };
            self.buf = bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect();
        }
        Ok(self.buf[((pos - self.base) / 4) as usize])
    }

    /// `n` bytes from monotonic position `pos`, wrapping at the end.
    fn read(&self, pos: u64, n: u64) -> Result<Vec<u8>, Halt> {
        let mut bytes = vec![0u8; n as usize];
        let mut done = 0u64;
        while done < n {
            let off = (pos + done) % self.size;
            let part = (n - done).min(self.size - off);
            self.range
                .read(off, &mut bytes[done as usize..(done + part) as usize])
                .map_err(fault("ring"))?;
            done += part;
        }
        Ok(bytes)
    }
}

/// What one packet does, its operands resolved.
enum Op {
    Nop,
    Copy {
        src: GpuRange,
        dst: GpuRange,
    },
    Write {
        dst: GpuRange,
        data: Vec<u8>,
    },
    Fill {
        dst: GpuRange,
        pat: [u8; 4],
        bytewise: bool,
    },
    Trap(u32),
}

/// A decoded packet: its name (for the log), what it does and its size
/// in bytes.
struct Packet {
    name: &'static str,
    op: Op,
    bytes: u64,
}

/// What a pass records while running a queue's packets.
#[derive(Default)]
struct Effects {
    traps: Vec<u32>,
}

impl Op {
    fn run(&self, fx: &mut Effects) -> Result<(), Halt> {
        match self {
            Op::Nop => Ok(()),
            Op::Copy { src, dst } => dst.copy_from(0, src, 0, dst.len()).map_err(fault("copy")),
            Op::Write { dst, data } => dst.write(0, data).map_err(fault("destination")),
            Op::Fill { dst, pat, bytewise } => {
                let n = dst.len() as usize;
                let buf: Vec<u8> = if *bytewise {
                    vec![pat[0]; n]
                } else {
                    (0..n).map(|i| pat[i % 4]).collect()
                };
                dst.write(0, &buf).map_err(fault("destination"))
            }
            Op::Trap(ctx) => {
                fx.traps.push(*ctx);
                Ok(())
            }
        }
    }
}

enum Step {
    Packet(Packet),
    /// The packet is not completely written yet.
    Incomplete,
    /// Unknown packet or a fault reading the ring: the queue halts.
    Halt(&'static str, Halt),
}

/// Decodes the packet at ring position `rptr`; `wptr` bounds what is
/// written.
fn decode(p: &Proc, q: &Queue, ring: &mut Ring, rptr: u64, wptr: u64) -> Step {
    let avail_dw = (wptr - rptr) / 4;
    let h = match ring.dw(rptr, wptr) {
        Ok(h) => h,
        Err(e) => return Step::Halt("ring read", e),
    };
    let (op, sub) = (h & 0xff, (h >> 8) & 0xff);
    let (name, len) = match (op, sub) {
        (OP_NOP, _) => ("NOP", 1 + ((h >> 16) & 0x3fff) as u64),
        (OP_COPY, SUBOP_LINEAR) => ("COPY_LINEAR", 7),
        (OP_WRITE, SUBOP_LINEAR) => {
            if avail_dw < 4 {
                return Step::Incomplete;
            }
            match ring.dw(rptr + 12, wptr) {
                Ok(c) => ("WRITE_LINEAR", 4 + (c & 0xfffff) as u64 + 1),
                Err(e) => return Step::Halt("WRITE_LINEAR", e),
            }
        }
        (OP_FENCE, _) => ("FENCE", 4),
        (OP_TRAP, _) => ("TRAP", 2),
        (OP_CONST_FILL, _) => ("CONST_FILL", 5),
        _ => {
            return Step::Halt(
                "packet",
                Halt::Bad(format!(
                    "unsupported SDMA packet: header {h:#010x} (op {op}, sub-op {sub})"
                )),
            )
        }
    };
    if len > avail_dw {
        return Step::Incomplete;
    }
    if len * 4 > q.ring_size as u64 {
        return Step::Halt(name, Halt::Bad("packet larger than the ring".into()));
    }
    let mut dw = Vec::with_capacity(len as usize);
    for i in 0..len {
        match ring.dw(rptr + i * 4, wptr) {
            Ok(d) => dw.push(d),
            Err(e) => return Step::Halt(name, e),
        }
    }
    let range = |lo, hi, n: u64| p.gpu_range(q.gpu, addr(lo, hi), n);
    let op = match op {
        OP_NOP => Op::Nop,
        OP_COPY => {
            let n = (dw[1] & 0x3f_ffff) as u64 + 1;
            Op::Copy {
                src: range(dw[3], dw[4], n),
                dst: range(dw[5], dw[6], n),
            }
        }
        OP_WRITE => {
            let data: Vec<u8> = dw[4..].iter().flat_map(|d| d.to_le_bytes()).collect();
            Op::Write {
                dst: range(dw[1], dw[2], data.len() as u64),
                data,
            }
        }
        OP_FENCE => Op::Write {
            dst: range(dw[1], dw[2], 4),
            data: dw[3].to_le_bytes().to_vec(),
        },
        OP_TRAP => Op::Trap(dw[1] & 0x0fff_ffff),
        OP_CONST_FILL => {
            let n = (dw[4] & 0x3f_ffff) as u64 + 1;
            Op::Fill {
                dst: range(dw[1], dw[2], n),
                pat: dw[3].to_le_bytes(),
                bytewise: h >> 30 == 0,
            }
        }
        _ => unreachable!("length decoded above"),
    };
    Step::Packet(Packet {
        name,
        op,
        bytes: len * 4,
    })
}

/// The packets of one queue planned for a pass.
pub struct QueueWork {
    id: u32,
    /// The queue's read pointer when planned.
    start: u64,
    packets: Vec<Packet>,
    /// Why the queue halts after these packets, if it does: the packet's
    /// name and the reason.
    halt: Option<(&'static str, Halt)>,
}

/// What a pass did to one queue.
pub struct QueueDone {
    id: u32,
    start: u64,
    rptr: u64,
    halt: Option<(&'static str, Halt)>,
    fx: Effects,
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
        if wptr < q.rptr || wptr % 4 != 0 || wptr - q.rptr > q.ring_size as u64 {
            w.halt = Some((
                "doorbell",
                Halt::Bad(format!(
                    "write pointer {wptr:#x} behind the read pointer, unaligned or more \
                     than a ring ahead"
                )),
            ));
        }
        let mut ring = Ring {
            range: p.gpu_range(q.gpu, q.ring_base, q.ring_size as u64),
            size: q.ring_size as u64,
            base: 0,
            buf: Vec::new(),
        };
        let mut rptr = q.rptr;
        while w.halt.is_none() && rptr < wptr && w.packets.len() < BUDGET {
            match decode(p, q, &mut ring, rptr, wptr) {
                Step::Packet(pk) => {
                    rptr += pk.bytes;
                    w.packets.push(pk);
                }
                Step::Incomplete => break,
                Step::Halt(name, why) => w.halt = Some((name, why)),
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
                fx: Effects::default(),
            };
            for pk in &w.packets {
                if let Err(e) = pk.op.run(&mut d.fx) {
                    d.halt = Some((pk.name, e));
                    return d;
                }
                d.rptr += pk.bytes;
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
    for mut d in done_queues {
        let Some(q) = p.queues.get(&d.id) else {
            continue;
        };
        if q.rptr != d.start {
            // Replaced while the packets ran (cannot happen: the ioctls
            // that touch queues wait for the pass).
            continue;
        }
        let (gpu, rptr_addr) = (q.gpu, q.rptr_addr);
        if d.rptr != d.start {
            worked = true;
            if let Err(f) = p
                .gpu_range(gpu, rptr_addr, 8)
                .write(0, &d.rptr.to_le_bytes())
            {
                d.halt.get_or_insert((
                    "read pointer write-back",
                    Halt::Fault {
                        what: "read pointer",
                        fault: f,
                    },
                ));
            }
        }
        let q = p.queues.get_mut(&d.id).expect("looked up above");
        q.rptr = d.rptr;
        if let Some((name, why)) = &d.halt {
            q.halted = true;
            log::warn!(
                "kfd-emu: process {} SDMA queue {} (GPU {}): {name} at rptr {:#x}: {why}; \
                 queue halted",
                p.lead,
                d.id,
                p.pdds[gpu].user_id,
                d.rptr
            );
        }
        for t in d.fx.traps {
            p.trap(t, done);
        }
    }
    worked
}
