//! The emulated SDMA engine: executes SDMA 4.x packets (the packet set of
//! GFX9: gfx908, gfx90a, gfx942) from user-mode ring buffers, with the
//! semantics the kernel's packet headers (vega10_sdma_pkt_open.h) and
//! their users (amdgpu, ROCr, libhsakmt's tests) give them.  Everything
//! the engine touches, its ring and read pointer included, is a GPU VA
//! reached through the VM of the queue's GPU (`vm`): a BO of the process
//! mapped there, or a GPU page fault.
//!
//! Packets (dword 0: op bits 7..0, sub-op bits 15..8; counts are "n - 1"):
//! * NOP (op 0): bits 29..16 = dwords that follow.
//! * COPY_LINEAR (1/0, 7 dw): count (bytes - 1, bits 21..0), parameter
//!   (swap modes), src lo/hi, dst lo/hi.
//! * COPY_LINEAR_SUB_WIND (1/4, 13 dw): a 3-D sub-window copy; header
//!   bits 31..29 log2 of the element size; src lo/hi; src x (13..0), y
//!   (29..16); src z (10..0), pitch - 1 (31..13); slice pitch - 1
//!   (27..0); the same for dst; rect x - 1, y - 1; rect z - 1.  Offsets
//!   and pitches count elements.
//! * WRITE_LINEAR (2/0, 4 + n dw): dst lo/hi, count (dwords - 1, bits
//!   19..0), then the data.
//! * FENCE (5, 4 dw): addr lo/hi, data (one dword written).
//! * TRAP (6, 2 dw): int_context bits 27..0; raises the interrupt KFD
//!   turns into signal events (`Proc::trap`).
//! * POLL_REGMEM (8/0, 6 dw): header bit 26 HDP flush, bits 30..28
//!   function, bit 31 memory; addr lo/hi; reference; mask; interval
//!   (15..0), retry count (27..16, 0xfff = forever).
//! * ATOMIC (10, 8 dw): header bit 16 loop, bits 31..25 operation (TC_OP
//!   codes); addr lo/hi; src lo/hi; cmp lo/hi; loop interval.
//! * CONST_FILL (11/0, 5 dw): header fill size bits 31..30 (0 byte, 2
//!   dword), dst lo/hi, data, count (bits 21..0): (count >> fill size)
//!   + 1 elements.
//! * GCR_REQ (17/1, 5 dw, SDMA 5.2 and later): a cache flush or
//!   invalidate over a VA range (ROCr's copies on GFX 11/12 carry one);
//!   nothing to do for memory without caches.
//! * TIMESTAMP (13, 3 dw): SET (0) loads the engine's local counter,
//!   GET (1) writes it, GET_GLOBAL (2) writes the GPU clock counter (the
//!   one GET_CLOCK_COUNTERS reads) at the 8-aligned address.
//!
//! Anything else (another opcode or sub-op, byte swapping, TMZ, broadcast
//! copies, register polls other than the HDP flush, float atomics) halts
//! the queue with a warning naming the packet.
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
//!
//! A POLL_REGMEM whose condition is false (and a looping ATOMIC whose
//! compare fails) stops its queue at that packet until a later pass: each
//! pass is one retry.  A finite retry count runs out after that many
//! passes; the engine then goes on with the next packet.

use super::asic::{gpu_clock_counter, IpVersion};
use super::state::{Done, EngineState, Proc};
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

fn bad(s: impl Into<String>) -> Halt {
    Halt::Bad(s.into())
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

/// POLL_REGMEM's and ATOMIC's compare functions.
#[derive(Clone, Copy, Debug)]
enum Func {
    Always,
    Less,
    LessEqual,
    Equal,
    NotEqual,
    GreaterEqual,
    Greater,
}

impl Func {
    fn decode(f: u32) -> Option<Func> {
        Some(match f {
            0 => Func::Always,
            1 => Func::Less,
            2 => Func::LessEqual,
            3 => Func::Equal,
            4 => Func::NotEqual,
            5 => Func::GreaterEqual,
            6 => Func::Greater,
            _ => return None,
        })
    }

    fn test(self, v: u32, reference: u32) -> bool {
        match self {
            Func::Always => true,
            Func::Less => v < reference,
            Func::LessEqual => v <= reference,
            Func::Equal => v == reference,
            Func::NotEqual => v != reference,
            Func::GreaterEqual => v >= reference,
            Func::Greater => v > reference,
        }
    }
}

/// An ATOMIC's operation on a 32- or 64-bit word.
#[derive(Clone, Copy, Debug)]
struct Atomic {
    kind: u32,
    wide: bool,
    src: u64,
    cmp: u64,
    /// CMPSWAP only: retry until the compare succeeds.
    looping: bool,
}

impl Atomic {
    /// The new value of the word holding `old` (None: left as is).
    fn apply(&self, old: u64) -> Option<u64> {
        use super::uapi::sdma::atomic::*;
        let bits = if self.wide { 64 } else { 32 };
        let m = if self.wide { u64::MAX } else { u32::MAX as u64 };
        let (s, c) = (self.src & m, self.cmp & m);
        let signed = |v: u64| ((v << (64 - bits)) as i64) >> (64 - bits);
        Some(match self.kind {
            SWAP => s,
            CMPSWAP => {
                if old != c {
                    return None;
                }
                s
            }
            ADD => old.wrapping_add(s) & m,
            SUB => old.wrapping_sub(s) & m,
            SMIN => {
                if signed(s) < signed(old) {
                    s
                } else {
                    old
                }
            }
            UMIN => old.min(s),
            SMAX => {
                if signed(s) > signed(old) {
                    s
                } else {
                    old
                }
            }
            UMAX => old.max(s),
            AND => old & s,
            OR => old | s,
            XOR => old ^ s,
            INC => {
                if old >= s {
                    0
                } else {
                    old + 1
                }
            }
            DEC => {
                if old == 0 || old > s {
                    s
                } else {
                    old - 1
                }
            }
            _ => unreachable!("checked at decode"),
        })
    }
}

/// A 3-D sub-window copy: `rows` runs of `row` bytes each.
struct Rect {
    src: GpuRange,
    dst: GpuRange,
    /// Bytes per row.
    row: u64,
    /// Offsets of each row in `src` and `dst`, by (z, y).
    src_step: (u64, u64),
    dst_step: (u64, u64),
    ny: u64,
    nz: u64,
}

/// What one packet does, its operands resolved.
enum Op {
    Nop,
    Copy {
        src: GpuRange,
        dst: GpuRange,
    },
    CopyRect(Box<Rect>),
    Write {
        dst: GpuRange,
        data: Vec<u8>,
    },
    Fill {
        dst: GpuRange,
        /// The element (1 or 4 bytes of the data dword).
        pat: Vec<u8>,
    },
    Trap(u32),
    Poll {
        mem: GpuRange,
        func: Func,
        reference: u32,
        mask: u32,
        retries: u32,
    },
    Atomic {
        dst: GpuRange,
        op: Atomic,
    },
    TimestampSet(u64),
    /// Writes the engine's local counter (`local`) or the GPU clock.
    Timestamp {
        dst: GpuRange,
        local: bool,
    },
}

/// A decoded packet: its name (for the log), what it does and its size
/// in bytes.
struct Packet {
    name: &'static str,
    op: Op,
    bytes: u64,
}

/// What a pass records while running a queue's packets.
struct Effects {
    traps: Vec<u32>,
    engine: EngineState,
}

/// How a packet ended.
enum Flow {
    Done,
    /// Its condition is false: the queue waits at it.
    Wait,
}

impl Op {
    /// Runs the packet at ring position `rptr`.
    fn run(&self, rptr: u64, fx: &mut Effects) -> Result<Flow, Halt> {
        match self {
            Op::Nop => {}
            Op::Copy { src, dst } => dst.copy_from(0, src, 0, dst.len()).map_err(fault("copy"))?,
            Op::CopyRect(r) => r.copy()?,
            Op::Write { dst, data } => dst.write(0, data).map_err(fault("destination"))?,
            Op::Fill { dst, pat } => {
                let buf: Vec<u8> = pat
                    .iter()
                    .copied()
                    .cycle()
                    .take(dst.len() as usize)
                    .collect();
                dst.write(0, &buf).map_err(fault("destination"))?
            }
            Op::Trap(ctx) => fx.traps.push(*ctx),
            Op::Poll {
                mem,
                func,
                reference,
                mask,
                retries,
            } => {
                let mut b = [0u8; 4];
                mem.read(0, &mut b).map_err(fault("polled memory"))?;
                return Ok(poll(
                    func.test(u32::from_le_bytes(b) & mask, *reference),
                    *retries,
                    rptr,
                    &mut fx.engine,
                ));
            }
            Op::Atomic { dst, op } => return op.run(dst, rptr, &mut fx.engine),
            Op::TimestampSet(v) => fx.engine.local_ts = v.wrapping_sub(gpu_clock_counter()),
            Op::Timestamp { dst, local } => {
                let mut t = gpu_clock_counter();
                if *local {
                    t = t.wrapping_add(fx.engine.local_ts);
                }
                dst.write(0, &t.to_le_bytes())
                    .map_err(fault("destination"))?
            }
        }
        Ok(Flow::Done)
    }
}

impl Rect {
    fn copy(&self) -> Result<(), Halt> {
        for z in 0..self.nz {
            for y in 0..self.ny {
                let s = z * self.src_step.0 + y * self.src_step.1;
                let d = z * self.dst_step.0 + y * self.dst_step.1;
                self.dst
                    .copy_from(d, &self.src, s, self.row)
                    .map_err(fault("copy"))?;
            }
        }
        Ok(())
    }
}

impl Atomic {
    /// Applies the atomic to `dst`; a looping compare-and-swap whose compare
    /// failed waits at `rptr` and tries again on the next pass.
    fn run(&self, dst: &GpuRange, rptr: u64, engine: &mut EngineState) -> Result<Flow, Halt> {
        // The compare of the last (successful) atomic attempt.
        let mut applied = true;
        let mut f = |v: u64| {
            let r = self.apply(v);
            applied = r.is_some();
            r
        };
        if self.wide {
            dst.atomic_u64(0, f).map(drop)
        } else {
            dst.atomic_u32(0, |v| f(v as u64).map(|n| n as u32))
                .map(drop)
        }
        .map_err(fault("destination"))?;
        if !applied && self.looping {
            engine.waiting = Some((rptr, tries_at(engine, rptr)));
            return Ok(Flow::Wait);
        }
        Ok(Flow::Done)
    }
}

/// POLL_REGMEM at `rptr` found its condition `met` or not: a false one
/// waits there, up to `retries` passes (or forever), then the engine goes on.
fn poll(met: bool, retries: u32, rptr: u64, engine: &mut EngineState) -> Flow {
    if met {
        return Flow::Done;
    }
    let tries = tries_at(engine, rptr);
    if retries == POLL_RETRY_FOREVER || tries <= retries {
        engine.waiting = Some((rptr, tries));
        return Flow::Wait;
    }
    log::warn!(
        "kfd-emu: SDMA POLL_REGMEM at rptr {rptr:#x}: condition still false \
         after {retries} retries; the engine goes on"
    );
    Flow::Done
}

/// The passes the packet at `rptr` has waited, this one included.
fn tries_at(engine: &EngineState, rptr: u64) -> u32 {
    match engine.waiting {
        Some((at, n)) if at == rptr => n + 1,
        _ => 1,
    }
}

enum Step {
    Packet(Packet),
    /// The packet is not completely written yet.
    Incomplete,
    /// Unknown packet or a fault reading the ring: the queue halts.
    Halt(&'static str, Halt),
}

/// The packet's name and size in dwords from its header (and, for
/// WRITE_LINEAR, its count dword) on a DMA IP of version `major`; None for
/// a packet the engine does not execute.  SDMA 7's COPY_LINEAR with the
/// CPV bit (19) carries an eighth dword, the DCC parameters
/// (`sdma_v7_0_emit_copy_buffer` always sets CPV and writes it).
fn shape(
    h: u32,
    major: u32,
    count: impl FnOnce() -> Result<Option<u32>, Halt>,
) -> Result<Option<(&'static str, u64)>, Halt> {
    let (op, sub) = (h & 0xff, (h >> 8) & 0xff);
    Ok(Some(match (op, sub) {
        (OP_NOP, 0) => ("NOP", 1 + ((h >> 16) & 0x3fff) as u64),
        (OP_COPY, SUBOP_COPY_LINEAR) if major >= 7 && (h >> 19) & 1 == 1 => ("COPY_LINEAR", 8),
        (OP_COPY, SUBOP_COPY_LINEAR) => ("COPY_LINEAR", 7),
        (OP_COPY, SUBOP_COPY_LINEAR_SUB_WIND) => ("COPY_LINEAR_SUB_WIND", 13),
        (OP_WRITE, SUBOP_WRITE_LINEAR) => match count()? {
            Some(c) => ("WRITE_LINEAR", 4 + (c & 0xfffff) as u64 + 1),
            None => ("WRITE_LINEAR", 4),
        },
        (OP_FENCE, 0) => ("FENCE", 4),
        (OP_TRAP, 0) => ("TRAP", 2),
        (OP_POLL_REGMEM, 0) => ("POLL_REGMEM", 6),
        (OP_ATOMIC, 0) => ("ATOMIC", 8),
        (OP_CONST_FILL, 0) => ("CONST_FILL", 5),
        (OP_GCR_REQ, SUBOP_USER_GCR) if major >= 5 => ("GCR_REQ", 5),
        (OP_TIMESTAMP, SUBOP_TIMESTAMP_SET) => ("TIMESTAMP_SET", 3),
        (OP_TIMESTAMP, SUBOP_TIMESTAMP_GET) => ("TIMESTAMP_GET", 3),
        (OP_TIMESTAMP, SUBOP_TIMESTAMP_GET_GLOBAL) => ("TIMESTAMP_GET_GLOBAL", 3),
        _ => return Ok(None),
    }))
}

/// How the engine reaches a GPU VA range: the queue's VM (a process' BOs
/// mapped on the GPU) or a render file's GEM VM (an IB).
type Vm<'a> = &'a dyn Fn(u64, u64) -> GpuRange;

/// Decodes the packet at ring position `rptr`; `wptr` bounds what is
/// written.  `ring_size` bounds a packet; `major` is the DMA IP's major
/// version.
fn decode(
    vm: Vm<'_>,
    ring_size: u64,
    ip: IpVersion,
    ring: &mut Ring,
    rptr: u64,
    wptr: u64,
) -> Step {
    let major = ip.0;
    let avail_dw = (wptr - rptr) / 4;
    let h = match ring.dw(rptr, wptr) {
        Ok(h) => h,
        Err(e) => return Step::Halt("ring read", e),
    };
    let count = || {
        if avail_dw < 4 {
            return Ok(None);
        }
        ring.dw(rptr + 12, wptr).map(Some)
    };
    let (name, len) = match shape(h, major, count) {
        Ok(Some(s)) => s,
        Ok(None) => {
            let (op, sub) = (h & 0xff, (h >> 8) & 0xff);
            return Step::Halt(
                "packet",
                bad(format!(
                    "unsupported SDMA packet: header {h:#010x} (op {op}, sub-op {sub})"
                )),
            );
        }
        Err(e) => return Step::Halt("WRITE_LINEAR", e),
    };
    if len > avail_dw || (name == "WRITE_LINEAR" && len == 4) {
        return Step::Incomplete;
    }
    if len * 4 > ring_size {
        return Step::Halt(name, bad("packet larger than the ring"));
    }
    let mut dw = Vec::with_capacity(len as usize);
    for i in 0..len {
        match ring.dw(rptr + i * 4, wptr) {
            Ok(d) => dw.push(d),
            Err(e) => return Step::Halt(name, e),
        }
    }
    match operands(vm, ip, name, &dw) {
        Ok(op) => Step::Packet(Packet {
            name,
            op,
            bytes: len * 4,
        }),
        Err(e) => Step::Halt(name, e),
    }
}

/// Resolves the operands of packet `name` (dwords `dw`).
fn operands(vm: Vm<'_>, ip: IpVersion, name: &'static str, dw: &[u32]) -> Result<Op, Halt> {
    Ok(match name {
        // The emulated GPU's memory has no caches to flush or invalidate.
        "NOP" | "GCR_REQ" => Op::Nop,
        "COPY_LINEAR" => copy_linear(vm, ip, dw)?,
        "COPY_LINEAR_SUB_WIND" => copy_sub_window(vm, dw)?,
        "WRITE_LINEAR" => write_linear(vm, dw)?,
        "FENCE" => Op::Write {
            dst: vm(addr(dw[1], dw[2]), 4),
            data: dw[3].to_le_bytes().to_vec(),
        },
        "TRAP" => Op::Trap(dw[1] & 0x0fff_ffff),
        "POLL_REGMEM" => poll_regmem(vm, dw)?,
        "ATOMIC" => atomic(vm, dw)?,
        "CONST_FILL" => const_fill(vm, dw)?,
        "TIMESTAMP_SET" => Op::TimestampSet(addr(dw[1], dw[2])),
        "TIMESTAMP_GET" | "TIMESTAMP_GET_GLOBAL" => Op::Timestamp {
            // Address bits 2..0 are not part of the packet.
            dst: vm(addr(dw[1] & !7, dw[2]), 8),
            local: name == "TIMESTAMP_GET",
        },
        _ => unreachable!("shape() names only these"),
    })
}

fn aligned(what: &str, va: u64, a: u64) -> Result<(), Halt> {
    if va.is_multiple_of(a) {
        Ok(())
    } else {
        Err(bad(format!("{what} {va:#x} not {a}-byte aligned")))
    }
}

fn copy_linear(vm: Vm<'_>, ip: IpVersion, dw: &[u32]) -> Result<Op, Halt> {
    let h = dw[0];
    if h & (1 << 27) != 0 {
        return Err(bad("broadcast copy not modelled"));
    }
    no_tmz(h)?;
    cache_policy(h, ip.0)?;
    no_swap(dw[2], 16, 24)?;
    // SDMA 7's DCC dword: compression is not modelled.
    if dw.len() == 8 && dw[7] != 0 {
        return Err(bad(format!(
            "COPY_LINEAR with DCC parameters {:#x} (compression) not modelled",
            dw[7]
        )));
    }
    let n = (dw[1] & copy_count_mask(ip)) as u64 + 1;
    Ok(Op::Copy {
        src: vm(addr(dw[3], dw[4]), n),
        dst: vm(addr(dw[5], dw[6]), n),
    })
}

fn copy_sub_window(vm: Vm<'_>, dw: &[u32]) -> Result<Op, Halt> {
    let h = dw[0];
    no_tmz(h)?;
    no_swap(dw[12], 16, 24)?;
    let log2 = (h >> 29) & 7;
    if log2 > 4 {
        return Err(bad(format!("element size code {log2}")));
    }
    let e = 1u64 << log2;
    let (rx, ry, rz) = (
        (dw[11] & 0x3fff) as u64 + 1,
        ((dw[11] >> 16) & 0x3fff) as u64 + 1,
        (dw[12] & 0x7ff) as u64 + 1,
    );
    // One side: base, x, y, z, pitch and slice pitch (elements).
    let side = |d: &[u32]| {
        let base = addr(d[0], d[1]);
        let (x, y) = ((d[2] & 0x3fff) as u64, ((d[2] >> 16) & 0x3fff) as u64);
        let z = (d[3] & 0x7ff) as u64;
        let pitch = (d[3] >> 13) as u64 + 1;
        let slice = (d[4] & 0x0fff_ffff) as u64 + 1;
        // Element offsets are below 2^50: no overflow before the
        // base is added.
        let first = base.checked_add((z * slice + y * pitch + x) * e);
        let last = base.checked_add(((z + rz - 1) * slice + (y + ry - 1) * pitch + x + rx) * e);
        match (first, last) {
            (Some(f), Some(l)) => Ok((vm(f, l - f), (slice * e, pitch * e))),
            _ => Err(bad("sub-window past the end of the address space")),
        }
    };
    let (src, src_step) = side(&dw[1..6])?;
    let (dst, dst_step) = side(&dw[6..11])?;
    Ok(Op::CopyRect(Box::new(Rect {
        src,
        dst,
        row: rx * e,
        src_step,
        dst_step,
        ny: ry,
        nz: rz,
    })))
}

fn write_linear(vm: Vm<'_>, dw: &[u32]) -> Result<Op, Halt> {
    no_tmz(dw[0])?;
    no_swap(dw[3], 24, 24)?;
    let data: Vec<u8> = dw[4..].iter().flat_map(|d| d.to_le_bytes()).collect();
    Ok(Op::Write {
        dst: vm(addr(dw[1], dw[2]), data.len() as u64),
        data,
    })
}

fn poll_regmem(vm: Vm<'_>, dw: &[u32]) -> Result<Op, Halt> {
    let h = dw[0];
    let func = Func::decode((h >> 28) & 7)
        .ok_or_else(|| bad(format!("compare function {}", (h >> 28) & 7)))?;
    let a = addr(dw[1], dw[2]);
    if h >> 31 == 0 {
        // A register poll.  With the HDP flush bit, the engine
        // flushes the HDP (the write to the flush request
        // register) and polls the flush-done register: the
        // emulated memory has no HDP cache, so the flush is done
        // at once.  With function "always" the register read
        // cannot fail (ROCr's HDP flush packet for gfx9 SDMA
        // firmware is this form).  Other registers are not
        // modelled.
        if (h >> 26) & 1 == 1 || matches!(func, Func::Always) {
            return Ok(Op::Nop);
        }
        return Err(bad(format!(
            "poll of register {:#x} not modelled",
            dw[1] >> 2
        )));
    }
    aligned("polled address", a, 4)?;
    Ok(Op::Poll {
        mem: vm(a, 4),
        func,
        reference: dw[3],
        mask: dw[4],
        retries: (dw[5] >> 16) & 0xfff,
    })
}

fn atomic(vm: Vm<'_>, dw: &[u32]) -> Result<Op, Halt> {
    use super::uapi::sdma::atomic::*;
    let h = dw[0];
    no_tmz(h)?;
    let code = (h >> 25) & 0x7f;
    let kind = code & 0x1f;
    if !(SWAP..=DEC).contains(&kind) || (CMPSWAP + 1..ADD).contains(&kind) {
        return Err(bad(format!("atomic operation {code:#x} not modelled")));
    }
    let wide = code & BIT_64 != 0;
    let a = addr(dw[1], dw[2]);
    let size = if wide { 8 } else { 4 };
    aligned("address", a, size)?;
    Ok(Op::Atomic {
        dst: vm(a, size),
        op: Atomic {
            kind,
            wide,
            src: addr(dw[3], dw[4]),
            cmp: addr(dw[5], dw[6]),
            looping: kind == CMPSWAP && (h >> 16) & 1 == 1,
        },
    })
}

fn const_fill(vm: Vm<'_>, dw: &[u32]) -> Result<Op, Halt> {
    let h = dw[0];
    no_swap(h, 16, 16)?;
    let size = h >> 30;
    let pat = match size {
        0 => dw[3].to_le_bytes()[..1].to_vec(),
        2 => dw[3].to_le_bytes().to_vec(),
        _ => return Err(bad(format!("fill size {size} not modelled"))),
    };
    let n = (((dw[4] & 0x3f_ffff) >> size) as u64 + 1) << size;
    Ok(Op::Fill {
        dst: vm(addr(dw[1], dw[2]), n),
        pat,
    })
}

/// The header's CPV bit (19, "cache policy valid"): SDMA 5 and later
/// (`sdma_v7_0_emit_copy_buffer` sets it) take the cache policies in the
/// parameter dword (bits 20..18 and 28..26, which do not change where the
/// bytes go); on SDMA 4.x the bit is reserved.
/// COPY_LINEAR's count field: 22 bits, 30 on SDMA 4.4 (gfx90a, gfx942)
/// and 5.2 and later (ROCr's `CreateBlitSdma` sizes its copies so).
fn copy_count_mask(ip: IpVersion) -> u32 {
    let IpVersion(major, minor, _) = ip;
    if major > 5 || (major, minor) >= (5, 2) || (major == 4 && minor >= 4) {
        0x3fff_ffff
    } else {
        0x3f_ffff
    }
}

fn cache_policy(h: u32, major: u32) -> Result<(), Halt> {
    if (h >> 19) & 1 == 1 && major < 5 {
        return Err(bad(format!(
            "CPV bit (19) set in a COPY_LINEAR header: reserved on SDMA {major}.x"
        )));
    }
    Ok(())
}

/// The header's TMZ bit (18): trusted memory is not modelled.
fn no_tmz(h: u32) -> Result<(), Halt> {
    if (h >> 18) & 1 == 1 {
        return Err(bad("TMZ (trusted memory) access not modelled"));
    }
    Ok(())
}

/// The 2-bit byte-swap modes at bits `a` and `b` of `w` must be 0.
fn no_swap(w: u32, a: u32, b: u32) -> Result<(), Halt> {
    if (w >> a) & 3 != 0 || (w >> b) & 3 != 0 {
        return Err(bad("byte swapping not modelled"));
    }
    Ok(())
}

/// The packets of one queue planned for a pass.
pub struct QueueWork {
    id: u32,
    /// The queue's GPU (index).
    gpu: usize,
    /// The queue's read pointer when planned.
    start: u64,
    engine: EngineState,
    packets: Vec<Packet>,
    /// Why the queue halts after these packets, if it does: the packet's
    /// name and the reason.
    halt: Option<(&'static str, Halt)>,
}

/// What a pass did to one queue.
pub struct QueueDone {
    id: u32,
    gpu: usize,
    /// How long its packets took to run.
    took: std::time::Duration,
    start: u64,
    rptr: u64,
    halt: Option<(&'static str, Halt)>,
    fx: Effects,
}

/// Reads the rings of the process' runnable SDMA queues and resolves
/// their packets (under the state lock).  Empty when there is nothing to
/// do.
pub fn plan(p: &Proc, ips: &[IpVersion]) -> Vec<QueueWork> {
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
            gpu: q.gpu,
            start: q.rptr,
            engine: q.engine.clone(),
            packets: Vec::new(),
            halt: None,
        };
        if wptr < q.rptr || wptr % 4 != 0 || wptr - q.rptr > q.ring_size as u64 {
            w.halt = Some((
                "doorbell",
                bad(format!(
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
        let vm = |va: u64, n: u64| p.gpu_range(q.gpu, va, n);
        let ip = ips.get(q.gpu).copied().unwrap_or(IpVersion(4, 0, 0));
        while w.halt.is_none() && rptr < wptr && w.packets.len() < BUDGET {
            match decode(&vm, q.ring_size as u64, ip, &mut ring, rptr, wptr) {
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
            let start = std::time::Instant::now();
            let mut d = run_queue(w);
            d.took = start.elapsed();
            d
        })
        .collect()
}

impl QueueDone {
    /// The queue's GPU and how long its packets took to run.
    pub fn took(&self) -> (usize, std::time::Duration) {
        (self.gpu, self.took)
    }
}

/// Runs one queue's planned packets.
fn run_queue(w: QueueWork) -> QueueDone {
    let mut d = QueueDone {
        id: w.id,
        gpu: w.gpu,
        took: Default::default(),
        start: w.start,
        rptr: w.start,
        halt: None,
        fx: Effects {
            traps: Vec::new(),
            engine: w.engine,
        },
    };
    for pk in &w.packets {
        match pk.op.run(d.rptr, &mut d.fx) {
            Ok(Flow::Done) => {}
            Ok(Flow::Wait) => return d,
            Err(e) => {
                d.halt = Some((pk.name, e));
                return d;
            }
        }
        d.rptr += pk.bytes;
    }
    d.halt = w.halt;
    d
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
        if d.fx.engine.waiting.is_some_and(|(at, _)| at != d.rptr) {
            d.fx.engine.waiting = None;
        }
        q.engine = d.fx.engine;
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
            if let Halt::Fault { fault, .. } = why {
                if let Some(va) = fault.page_fault_va() {
                    p.vm_fault(gpu, va, done);
                }
            }
        }
        for t in d.fx.traps {
            p.trap(t, done);
        }
    }
    worked
}

/// The packets of one indirect buffer (an AMDGPU_CS IB on a DMA ring),
/// resolved through the submitting file's GEM VM.
pub struct IbWork {
    packets: Vec<Packet>,
    /// Why the IB stops after these packets, if it does.
    halt: Option<(&'static str, Halt)>,
}

/// Why an IB did not complete: a hang the kernel would end with a job
/// timeout and a GPU reset.
#[derive(Debug)]
pub struct IbHang {
    pub what: String,
}

/// Decodes the IB of `bytes` bytes at `va` (under the state lock).
pub fn plan_ib(vm: Vm<'_>, ip: IpVersion, va: u64, bytes: u64) -> IbWork {
    let mut w = IbWork {
        packets: Vec::new(),
        halt: None,
    };
    let mut ring = Ring {
        range: vm(va, bytes),
        size: bytes,
        base: 0,
        buf: Vec::new(),
    };
    let mut pos = 0;
    while pos < bytes {
        match decode(vm, bytes, ip, &mut ring, pos, bytes) {
            Step::Packet(pk) => {
                pos += pk.bytes;
                w.packets.push(pk);
            }
            Step::Incomplete => {
                w.halt = Some((
                    "IB",
                    bad(format!("the IB ends inside the packet at byte {pos:#x}")),
                ));
                break;
            }
            Step::Halt(name, why) => {
                w.halt = Some((name, why));
                break;
            }
        }
    }
    w
}

/// How long an IB packet may wait (POLL_REGMEM, a looping ATOMIC) before
/// the job counts as hung: amdgpu's default `lockup_timeout` for
/// non-compute rings.
pub const IB_LOCKUP: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs a planned IB (without the state lock).
pub fn run_ib(w: IbWork) -> Result<(), IbHang> {
    let mut fx = Effects {
        traps: Vec::new(),
        engine: EngineState::default(),
    };
    let deadline = std::time::Instant::now() + IB_LOCKUP;
    let hang = |name: &str, pos: u64, why: Halt| IbHang {
        what: format!("{name} at IB byte {pos:#x}: {why}"),
    };
    let mut pos = 0u64;
    for pk in &w.packets {
        loop {
            match pk.op.run(pos, &mut fx) {
                Ok(Flow::Done) => break,
                Ok(Flow::Wait) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_micros(50))
                }
                Ok(Flow::Wait) => {
                    return Err(hang(
                        pk.name,
                        pos,
                        bad("still waiting at the lockup timeout"),
                    ))
                }
                Err(e) => return Err(hang(pk.name, pos, e)),
            }
        }
        pos += pk.bytes;
    }
    match w.halt {
        Some((name, why)) => Err(hang(name, pos, why)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_counts_widen_on_sdma_4_4_and_5_2() {
        assert_eq!(copy_count_mask(IpVersion(4, 2, 2)), 0x3f_ffff, "gfx908");
        assert_eq!(copy_count_mask(IpVersion(4, 4, 0)), 0x3fff_ffff, "gfx90a");
        assert_eq!(copy_count_mask(IpVersion(4, 4, 2)), 0x3fff_ffff, "gfx942");
        assert_eq!(copy_count_mask(IpVersion(5, 0, 0)), 0x3f_ffff, "gfx1010");
        assert_eq!(copy_count_mask(IpVersion(5, 2, 0)), 0x3fff_ffff, "gfx1030");
        assert_eq!(copy_count_mask(IpVersion(7, 0, 1)), 0x3fff_ffff, "gfx1201");
    }

    /// COPY_LINEAR is 7 dwords, 8 on SDMA 7 with the CPV bit (the header
    /// `sdma_v7_0_emit_copy_buffer` writes: 0x0008_0001).
    #[test]
    fn copy_linear_length_follows_the_dma_ip() {
        let none = || Ok(None);
        assert_eq!(
            shape(0x0008_0001, 7, none).unwrap(),
            Some(("COPY_LINEAR", 8))
        );
        assert_eq!(
            shape(0x0000_0001, 7, none).unwrap(),
            Some(("COPY_LINEAR", 7))
        );
        assert_eq!(
            shape(0x0000_0001, 4, none).unwrap(),
            Some(("COPY_LINEAR", 7))
        );
        // CPV on SDMA 4 is a reserved bit: 7 dwords, refused by the decoder.
        assert_eq!(
            shape(0x0008_0001, 4, none).unwrap(),
            Some(("COPY_LINEAR", 7))
        );
        assert!(cache_policy(0x0008_0001, 4).is_err());
        assert!(cache_policy(0x0008_0001, 7).is_ok());
    }
}
