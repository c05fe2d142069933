//! kfd-emu: a userspace emulator of AMD's `/dev/kfd` and
//! `/dev/dri/renderD*` for testing criu-rocm without a GPU.
//!
//! * [`profile`]: machine profiles (which GPUs, their properties);
//! * [`topology`]: the sysfs topology tree a profile describes;
//! * `fuse`: the hand-written FUSE transport serving the device nodes;
//! * `runner`: `kfd-emu run`, the private mount namespace around a command;
//! * `device`: the device state machine behind the transport;
//! * [`fault`]: test knobs that make CRIU ops fail (`kfd-emu run --fail`);
//! * [`supervise`]: `kfd-emu supervise`, the seccomp listener through which
//!   the emulator hands out file descriptors (dma-bufs).

pub mod device;
pub mod fault;
pub mod fuse;
pub mod profile;
pub mod runner;
pub mod serve;
pub mod supervise;
pub mod sysfs;
pub mod topology;
