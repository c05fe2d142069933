//! Execution: the opcode tables of every encoding and the run loop.
//!
//! Each family module owns its table: opcode number, mnemonic, and the function that runs
//! it. An opcode absent from the table is an [`Illegal::UnknownOpcode`], never a guess.

mod dot;
mod ds;
mod flat;
mod fp8;
mod gfx942;
mod mfma;
mod mubuf;
mod opdef;
mod operand;
mod salu;
mod smem;
mod sopp;
mod table;
mod valu;
mod vmem;
mod vop;

use std::fmt;

use crate::cache::ICache;
use crate::decode::{self, DecodeError, Encoding, Instr};
use crate::memory::{Fault, Memory};
use crate::state::{Target, Wave};

pub use table::{lookup, on_target, opcodes, OpDef};

/// Where a wave stopped and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// `s_endpgm`: the wave is done.
    Endpgm,
    /// `s_barrier`: resume once every wave of the workgroup got here (PC is past it).
    Barrier,
    /// `s_sleep N`: the wave asks to sleep about 64*N clocks (PC is past it).
    Sleep(u16),
    /// `s_trap N` (PC is past it); the CP model decides what a trap means.
    Trap(u8),
    /// `s_sendmsg sendmsg(MSG_INTERRUPT)` (PC is past it): the wave raises the SQ's message
    /// interrupt with M0 as its data (the device libraries' signal code puts an event ID
    /// there for KFD); the CP model delivers it.
    Interrupt(u32),
    /// `s_sethalt` with a non-zero halt bit.
    Halt,
    /// The instruction budget ran out (PC at the next instruction).
    Budget,
    /// A memory access faulted; PC stays at the instruction.
    Fault { fault: Fault, pc: u64 },
    /// The wave cannot go on; PC stays at the instruction.
    Illegal { reason: Illegal, pc: u64 },
}

/// Why an instruction cannot run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Illegal {
    /// The words are no instruction.
    Decode(DecodeError),
    /// The encoding is known, the opcode is not one this engine implements for the target.
    UnknownOpcode {
        enc: Encoding,
        op: u16,
        target: Target,
    },
    /// The opcode is known, an operand or modifier combination is not implemented or is
    /// invalid (a VGPR tuple past v255, a misaligned pair, DPP on an opcode that forbids it).
    Operand {
        name: &'static str,
        what: &'static str,
    },
    /// Code could not be fetched.
    Fetch(Fault),
}

impl fmt::Display for Illegal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Illegal::Decode(e) => write!(f, "undecodable instruction: {e}"),
            Illegal::UnknownOpcode { enc, op, target } => {
                write!(f, "unknown opcode {op:#x} of encoding {enc} on {target:?}")
            }
            Illegal::Operand { name, what } => write!(f, "{name}: {what}"),
            Illegal::Fetch(fault) => write!(f, "instruction fetch: {fault}"),
        }
    }
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stop::Fault { fault, pc } => write!(f, "memory fault at PC {pc:#x}: {fault}"),
            Stop::Illegal { reason, pc } => {
                write!(f, "illegal instruction at PC {pc:#x}: {reason}")
            }
            other => write!(f, "{other:?}"),
        }
    }
}

/// What an instruction asks of the run loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Go on with the next instruction.
    Next,
    /// Go on at this address.
    Jump(u64),
    /// Advance past the instruction and return to the scheduler.
    Yield(Stop),
}

/// Stops an instruction returns; the run loop adds the PC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Abort {
    Fault(Fault),
    Illegal(Illegal),
}

impl From<Fault> for Abort {
    fn from(f: Fault) -> Abort {
        Abort::Fault(f)
    }
}

/// What one instruction returns.
pub type Step = Result<Flow, Abort>;

/// The function that runs one opcode.
pub type ExecFn = fn(&mut Cx<'_>, &Instr) -> Step;

/// Everything an instruction may touch.
pub struct Cx<'a> {
    pub w: &'a mut Wave,
    pub mem: &'a mut dyn Memory,
    pub lds: &'a mut [u8],
}

/// A decoded instruction with its table entry, as the cache keeps it.
#[derive(Clone, Copy, Debug)]
pub struct Decoded {
    pub instr: Instr,
    pub def: &'static OpDef,
}

/// The instruction cache a group of waves running the same code shares.
pub type CodeCache = ICache<Decoded>;

/// An illegal-operand abort for `i`.
pub(crate) fn bad(name: &'static str, what: &'static str) -> Abort {
    Abort::Illegal(Illegal::Operand { name, what })
}

impl Wave {
    /// Runs at most `budget` instructions; returns why it stopped.
    pub fn run(
        &mut self,
        mem: &mut dyn Memory,
        lds: &mut [u8],
        cache: &mut CodeCache,
        budget: u64,
    ) -> Stop {
        for _ in 0..budget {
            if let Some(stop) = self.step(mem, lds, cache) {
                return stop;
            }
        }
        Stop::Budget
    }

    /// Runs one instruction; `None` when the wave simply goes on.
    pub fn step(
        &mut self,
        mem: &mut dyn Memory,
        lds: &mut [u8],
        cache: &mut CodeCache,
    ) -> Option<Stop> {
        let pc = self.pc;
        let target = self.target;
        let d = match cache.get_or_fill(pc, |pc| fetch(mem, target, pc)) {
            Ok(d) => d,
            Err(reason) => return Some(Stop::Illegal { reason, pc }),
        };
        let (run, len) = (d.def.run, d.instr.len);
        let lanes = if is_scalar(d.instr.enc) {
            0
        } else {
            self.exec().count_ones()
        };
        let mut cx = Cx { w: self, mem, lds };
        let flow = run(&mut cx, &d.instr);
        self.retire(flow, pc, len, lanes)
    }

    /// Retires the instruction at `pc` that ran `lanes` lane operations.
    fn retire(&mut self, flow: Step, pc: u64, len: u8, lanes: u32) -> Option<Stop> {
        let next = pc.wrapping_add(len as u64);
        match flow {
            Ok(Flow::Next) => self.pc = next,
            Ok(Flow::Jump(t)) => self.pc = t,
            Ok(Flow::Yield(stop)) => {
                self.pc = next;
                self.retired += 1;
                self.lanes += lanes as u64;
                return Some(stop);
            }
            Err(Abort::Fault(fault)) => return Some(Stop::Fault { fault, pc }),
            Err(Abort::Illegal(reason)) => return Some(Stop::Illegal { reason, pc }),
        }
        self.retired += 1;
        self.lanes += lanes as u64;
        None
    }
}

/// Whether instructions of `enc` run once per wave (scalar ALU, branches, scalar memory)
/// rather than once per lane.
fn is_scalar(enc: Encoding) -> bool {
    matches!(
        enc,
        Encoding::Sop2
            | Encoding::Sopk
            | Encoding::Sop1
            | Encoding::Sopc
            | Encoding::Sopp
            | Encoding::Smem
    )
}

/// Reads and decodes the instruction at `pc`, word by word so that an instruction ending a
/// mapping does not fault on the bytes past it.
pub fn fetch(mem: &mut dyn Memory, target: Target, pc: u64) -> Result<Decoded, Illegal> {
    let mut words = [0u32; 3];
    let mut have = 0;
    loop {
        match decode::decode(&words[..have]) {
            Ok(instr) => {
                let def = lookup(target, &instr).ok_or(Illegal::UnknownOpcode {
                    enc: instr.enc,
                    op: instr.op,
                    target,
                })?;
                return Ok(Decoded { instr, def });
            }
            Err(DecodeError::Truncated { need }) if need <= words.len() => {
                while have < need {
                    let mut b = [0u8; 4];
                    mem.read(pc + 4 * have as u64, &mut b)
                        .map_err(Illegal::Fetch)?;
                    words[have] = u32::from_le_bytes(b);
                    have += 1;
                }
            }
            Err(e) => return Err(Illegal::Decode(e)),
        }
    }
}
