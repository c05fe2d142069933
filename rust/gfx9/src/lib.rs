//! A GFX9 shader engine: the gfx908 (MI100, CDNA1), gfx90a (MI200, CDNA2) and gfx942 (MI300,
//! CDNA3) instruction set.
//!
//! The crate knows nothing of KFD, queues or processes. A caller (kfd-emu's CP model) builds a
//! [`Wave`] with the initial register state the CP and SPI would set, gives it a [`Memory`]
//! (the process' GPU virtual memory) and the workgroup's LDS, and calls [`Wave::run`] with an
//! instruction budget. The wave returns at every point a scheduler must see: `s_endpgm`,
//! `s_barrier`, `s_sleep`, `s_trap`, a memory fault, an instruction it cannot run, or the end of
//! the budget.
//!
//! Layers: [`decode`] turns instruction words into an [`Instr`] (formats and fields only);
//! [`exec`] holds the opcode tables (opcode → mnemonic → semantics) and runs instructions
//! against [`state`] and [`memory`]; [`cache`] keeps decoded instructions per code address;
//! [`cwsr`] saves waves into a context save area in the layout of KFD's gfx9 trap handler and
//! rebuilds them from it; [`launch`] gives a kernel dispatch's waves their initial state.

pub mod cache;
pub mod cwsr;
pub mod decode;
pub mod exec;
pub mod fp;
pub mod launch;
pub mod memory;
mod regfile;
pub mod state;

pub use cache::ICache;
pub use decode::{DecodeError, Encoding, Instr};
pub use exec::{Illegal, Stop};
pub use memory::{AtomicOp, Fault, Memory, VecMemory};
pub use state::{Target, Wave};
