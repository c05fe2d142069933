//! kfd-emu: a userspace emulator of AMD's `/dev/kfd` and
//! `/dev/dri/renderD*` for testing criu-rocm without a GPU.
//!
//! Layers, bottom to top (a module uses only those below it; see the
//! README's module map):
//!
//! * [`profile`], [`topology`], [`sysfs`]: machine profiles (which GPUs,
//!   their properties and links) and the sysfs they describe;
//! * [`device`]: the device state machine and, above it, the ioctl ABI
//!   decode; it knows no transport;
//! * [`fuse`]: the hand-written FUSE transport serving the device nodes;
//!   [`supervise`]: `kfd-emu supervise`, the seccomp listener through which
//!   the emulator hands out file descriptors (dma-bufs), and [`chardev`]:
//!   the render nodes answered as character devices to the stat family;
//!   [`reattach`]: `kfd-emu supervise --attach`, a listener again for a
//!   process CRIU restored with the supervisor's filter;
//! * [`serve`]: the glue between the transports and the model;
//! * [`runner`]: `kfd-emu run`, the private mount namespace around a
//!   command;
//! * [`fault`]: test knobs that make CRIU ops fail (`kfd-emu run --fail`).

pub mod chardev;
pub mod device;
pub mod fault;
pub mod fuse;
#[cfg(target_arch = "x86_64")]
pub mod inject;
pub mod profile;
pub mod reattach;
pub mod runner;
pub mod serve;
pub mod supervise;
pub mod sysfs;
pub mod topology;

/// The last OS error with the call that failed named in front of it (its
/// errno kept), for the modules that make system calls of their own.
pub(crate) fn os_err(what: impl std::fmt::Display) -> std::io::Error {
    let e = std::io::Error::last_os_error();
    std::io::Error::new(e.kind(), format!("{what}: {e}"))
}
