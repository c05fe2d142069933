//! Compute-wave save/restore (CWSR): a wave's registers and its workgroup's LDS in the
//! layout KFD's gfx9 trap handler writes into a queue's context save area, and the control
//! stack that lists the saved waves.
//!
//! On the hardware, when KFD preempts a queue with wavefront save (CRIU's PROCESS_INFO evicts
//! the process' queues that way), the CP raises SAVECTX in every wave of the queue; the trap
//! handler (`cwsr_trap_handler_gfx9.asm` in the kernel) stores each wave's VGPRs, AccVGPRs,
//! SGPRs, hardware registers and trap temporaries, and the first wave of each workgroup its
//! LDS, at the address the SPI hands it inside the wave area of the context save area. The CP
//! pushes one record per wave onto the control stack, which on gfx9 lives one page after the
//! MQD; KFD's CHECKPOINT returns it with the MQD, RESTORE writes both back, and when the queue
//! is mapped again the CP relaunches the waves and the handler loads them back.
//!
//! The control stack's records are firmware-internal on the hardware; kfd-emu's CP model
//! uses the format of [`stack`] (versioned, documented there and in
//! Documentation/gpu-checkpoint-restore.md). Everything else ([`layout`], [`area`]) follows
//! the facts of the trap handler, KFD and libhsakmt so that a debugger's reading of the save
//! area (ROCdbgapi walks it the same way) finds the registers where the hardware puts them.
//!
//! The module knows nothing of KFD's ioctls, queues or the daemon: the caller (kfd-emu's CP
//! model) hands it the context save area of one XCC as a byte slice, the control stack
//! region's size, and the waves; every damaged size, offset, count or version on the way back
//! is an [`Error`] naming the field, never a panic.

pub mod area;
pub mod layout;
pub mod stack;
mod wave;

pub use area::{SaveArea, SaveWriter, Saved};
pub use layout::{Alloc, Header, WaveBlock};
pub use stack::{ControlStack, DispatchState, SavedWave, Xcc};
pub use wave::{restore_wave, save_wave};

use std::fmt;

/// A save area, control stack or wave that cannot be saved or restored: `field` names what
/// is wrong (`control stack: dispatch[0].wave[3].offset`), `what` says how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub field: String,
    pub what: String,
}

impl Error {
    pub(crate) fn new(field: impl Into<String>, what: impl Into<String>) -> Error {
        Error {
            field: field.into(),
            what: what.into(),
        }
    }

    /// The same error with `prefix.` in front of its field.
    pub(crate) fn within(self, prefix: &str) -> Error {
        Error {
            field: format!("{prefix}.{}", self.field),
            what: self.what,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.what)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Little-endian readers and writers over byte slices whose bounds the callers checked.
pub(crate) mod le {
    pub fn u16(b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes([b[at], b[at + 1]])
    }

    pub fn u32(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
    }

    pub fn u64(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
    }

    pub fn put16(b: &mut [u8], at: usize, v: u16) {
        b[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }

    pub fn put32(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    pub fn put64(b: &mut [u8], at: usize, v: u64) {
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
}
