//! A render file's amdgpu submission contexts, which fail its dump (see
//! [`super::gem`]): amdgpu has no call that lists them, so every id it can
//! hand out is probed (CTX GET_STABLE_PSTATE, which only reads), 4095
//! ioctls a file.  A dump starts the probes when it meets the files at the
//! pause, the tree frozen, in a thread of their own ([`ContextProbes`]):
//! they run beside CRIU's dump of the tasks' memory and the copies of the
//! KFD BOs instead of after them, and the render file's dump takes the
//! outcome.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use kfd_abi::handle::RenderNode;
use kfd_abi::layout::gem618;

/// The ids probed: 1 to this.  The kernel hands contexts out lowest-free
/// from 1 (`ctx_handles`, whose ids end below `AMDGPU_VM_MAX_NUM_CTX`,
/// 4096); GEM handles, probed on kernels that cannot list them, the same
/// way (the file's `object_idr`).
pub(crate) const PROBED_IDS: u32 = gem618::AMDGPU_VM_MAX_NUM_CTX - 1;

/// The context ids a render file holds, or the id whose probe failed and
/// how.
pub(crate) type Outcome = Result<Vec<u32>, (u32, kfd_abi::handle::Error)>;

/// Probes every context id of render file `fd`; stops early (with what it
/// found) once `stop` is set.
pub(crate) fn probe(fd: BorrowedFd<'_>, stop: &AtomicBool) -> Outcome {
    let node = RenderNode::from_fd(fd);
    let mut held = Vec::new();
    for ctx in 1..=PROBED_IDS {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if node.ctx_exists(ctx).map_err(|e| (ctx, e))? {
            held.push(ctx);
        }
    }
    Ok(held)
}

/// A probe for the worker: the file (our dup) and where its outcome goes.
type Job = (OwnedFd, mpsc::Sender<Outcome>);

/// The context probes of the render files a dump met, one after the other
/// in one thread, each outcome kept for the file's dump ([`Self::take`]).
#[derive(Default)]
pub(crate) struct ContextProbes {
    queue: Option<mpsc::Sender<Job>>,
    worker: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    /// The files' outcomes to come, by the key [`Self::start`] was given.
    pending: BTreeMap<usize, mpsc::Receiver<Outcome>>,
}

impl ContextProbes {
    /// Queues the probe of render file `fd` (a dup of it is kept) under
    /// `key`.
    pub fn start(&mut self, key: usize, fd: BorrowedFd<'_>) -> std::io::Result<()> {
        let fd = fd.try_clone_to_owned()?;
        if self.queue.is_none() {
            let (tx, rx) = mpsc::channel::<Job>();
            let stop = self.stop.clone();
            let worker = std::thread::Builder::new()
                .name("criu-rocm-ctx".into())
                .spawn(move || {
                    for (fd, out) in rx {
                        let _ = out.send(probe(fd.as_fd(), &stop));
                    }
                })?;
            self.queue = Some(tx);
            self.worker = Some(worker);
        }
        let (tx, rx) = mpsc::channel();
        let queued = self
            .queue
            .as_ref()
            .is_some_and(|q| q.send((fd, tx)).is_ok());
        if queued {
            self.pending.insert(key, rx);
        }
        Ok(())
    }

    /// The outcome of the probe started under `key`, once it is done;
    /// `None` if none was started (or the worker is gone): the caller
    /// probes itself.
    pub fn take(&mut self, key: usize) -> Option<Outcome> {
        self.pending.remove(&key)?.recv().ok()
    }

    /// Stops the probes not done and waits for the worker.
    pub fn clear(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.queue = None;
        self.pending.clear();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        self.stop = Arc::default();
    }
}

impl Drop for ContextProbes {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file that is not a render node fails the first probe, in the
    /// worker as inline; a key never started has no outcome.
    #[test]
    fn a_probe_outcome_is_the_files() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let mut p = ContextProbes::default();
        p.start(3, f.as_fd()).unwrap();
        let inline = probe(f.as_fd(), &AtomicBool::new(false));
        let bg = p.take(3).expect("started");
        assert_eq!(bg.as_ref().map_err(|e| e.0), Err(1));
        assert_eq!(inline.as_ref().map_err(|e| e.0), Err(1));
        assert!(p.take(3).is_none(), "taken once");
        assert!(p.take(4).is_none(), "never started");
        p.clear();
        p.start(5, f.as_fd()).unwrap();
        assert!(p.take(5).is_some(), "a cleared set starts again");
    }
}
