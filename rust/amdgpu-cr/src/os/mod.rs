//! The OS layer under the core: the process, fd, pidfd, futex, shared-memory
//! and file-identity primitives the sessions and plans use, each behind a
//! small safe function or type that keeps errno.  Nothing here knows about
//! GPUs, CRIU or images; the modules above hold the policy.
//!
//! | module | holds |
//! |---|---|
//! | [`futex`] | waiting on and waking a shared `AtomicU32` |
//! | [`shared`] | a zero-initialised `MAP_SHARED` object on a memfd, passed to a helper by fd |
//! | [`process`] | pids and pidfds, reaping, ptrace, a helper started by re-executing this program (tied to us or detached), a worker running a function in a copy of this process |
//! | [`signal`] | one process-wide handler for caught signals, ignoring, dying of a signal |
//! | [`fd`] | reaching another task's fds, comparing open files, fd numbering, memfds, socket pairs and records with an fd, polling |
//! | [`file`] | `stat`/`fstat`, `/proc/<pid>` directories, POSIX named semaphores |

pub mod fd;
pub mod file;
pub mod futex;
pub mod process;
pub mod shared;
pub mod signal;
