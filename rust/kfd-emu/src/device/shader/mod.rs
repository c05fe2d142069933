//! The shader engine: the waves of kernel dispatches run here, on a
//! worker thread of their own, never under the state lock.
//!
//! The CP model (`aql`) checks a dispatch packet and hands over a
//! [`Launch`]; the worker (`worker`) runs the waves of every live
//! dispatch in turns (`sched`: workgroups, barriers, budgets) over the
//! process' GPU VM (`gpumem`), and reports each dispatch's [`Outcome`]
//! back through its [`Host`], which takes the state lock only then and
//! once per round to refresh what the dispatches see of their processes.
//! Between rounds (every wave at an instruction boundary) it saves the
//! dispatches of an evicted queue into the queue's context save area
//! (`cwsr`), and rebuilds a dispatch from there when the queue runs again.

mod cus;
mod cwsr;
mod gpumem;
mod sched;
mod worker;

use std::fmt;

use gfx9::launch::{DispatchRegs, Grid, HwSlot, KernelCode};
use gfx9::Target;

use super::vm::GpuRange;
pub use cus::{CuLayout, WaveSlots};
pub use cwsr::{check_stacks, SaveArea, SaveJob, Saved};
pub use worker::{Engine, Host, Refresh};

/// Which dispatch: the process, the queue, the packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct JobKey {
    pub lead: u32,
    pub queue: u32,
    pub gpu: usize,
    /// The packet's index in the queue.
    pub index: u64,
    /// The kernel object (for log lines).
    pub object: u64,
}

/// A checked kernel dispatch: what the CP read from the packet, the
/// kernel object and the queue.
pub struct Launch {
    pub key: JobKey,
    pub target: Target,
    /// The kernel dispatch packet as the CP read it.
    pub packet: [u8; 64],
    pub object: u64,
    pub code: KernelCode,
    pub grid: Grid,
    pub regs: DispatchRegs,
    /// LDS bytes per workgroup.
    pub lds: usize,
    /// The queue's scratch as the CP splits it over the XCCs; None when
    /// the dispatch has no private segment.
    pub scratch: Option<ScratchSplit>,
    /// The CUs of each XCC the queue's CU mask enables (`cus`), and
    /// each one's wave slots: one list per XCC the CP hands the
    /// workgroups to, round-robin (1 but on MI300's partitions).
    pub cus: Vec<Vec<HwSlot>>,
    pub wave_slots: WaveSlots,
    /// The process' GPU VM as the GPU sees it.
    pub vm: GpuRange,
    /// A dispatch saved at an eviction: its waves are rebuilt from the
    /// queue's context save area and the control stack of each XCC
    /// instead of started.
    pub resume: Option<(SaveArea, Vec<Vec<u8>>)>,
}

/// A queue's scratch as the CP of a partition of several XCCs splits it:
/// XCC `x` gets the slice `x * xcc_bytes` bytes from the queue's scratch
/// base (ROCr sizes `scratch_backing_memory_byte_size` and
/// `compute_tmpring_size`'s WAVES per XCC), and its waves take slots of
/// `wave_bytes` in that slice, never another XCC's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScratchSplit {
    pub wave_bytes: u64,
    /// Wave slots in each XCC's slice.
    pub slots: u64,
    /// Bytes of each XCC's slice.
    pub xcc_bytes: u64,
}

/// How a dispatch ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every wave reached `s_endpgm`.
    Done { waves: u64, instructions: u64 },
    /// A wave's memory access faulted; `detail` says what is at the VA.
    Fault {
        fault: gfx9::Fault,
        pc: u64,
        detail: String,
    },
    /// A wave met an instruction the engine cannot run.
    Illegal { stop: String, pc: u64 },
    /// `s_trap N` (or `s_sethalt`: `code` 0xff).
    Trap { code: u8, pc: u64 },
    /// The saved dispatch cannot be rebuilt: `what` names the field of
    /// the control stack or save area that is damaged.
    Restore { what: String },
    /// The process exits: a wave's access met its address space gone
    /// (KFD's release removes such a process' queues quietly).
    Gone { pc: u64 },
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Done {
                waves,
                instructions,
            } => write!(f, "{waves} waves ran {instructions} instructions"),
            Outcome::Fault { fault, pc, detail } => {
                write!(f, "memory fault at PC {pc:#x}: {fault} ({detail})")
            }
            Outcome::Illegal { stop, .. } => f.write_str(stop),
            Outcome::Trap { code: 0xff, pc } => write!(f, "s_sethalt at PC {pc:#x}"),
            Outcome::Trap { code, pc } => write!(f, "s_trap {code} at PC {pc:#x}"),
            Outcome::Gone { pc } => write!(
                f,
                "its process exits (its address space was gone at PC {pc:#x})"
            ),
            Outcome::Restore { what } => {
                write!(
                    f,
                    "its waves cannot be restored from the context save area: {what}"
                )
            }
        }
    }
}
