//! BOs held by files of two processes of one dump (issue 29): the restore
//! of the first holder's process hands a dma-buf of the restored BO to the
//! process that imports it.
//!
//! The dump saves such a BO once, with its first holder, and records the
//! further holder (a render file of another process) as "the same BO as"
//! it, with the first holder's pid (`same_bo_pid`, see
//! [`super::dmabuf`]).  CRIU restores the processes of a tree at the same
//! time, each its own files, in fd order, and CRIU 4.2.1's
//! `RESTORE_EXT_FILE` cannot ask to be called again later (criu-dev's
//! amdgpu plugin returns "retry" there and parks the dma-buf in CRIU's
//! fdstore under the BO's GEM handle).  So the two tasks meet on an
//! exchange in shared memory instead, made in criu main before any task
//! exists ([`Exchange::create`]): one slot for every BO another process
//! imports, named by the first holder's CRIU file and its index there,
//! with how many files import it.
//!
//! * The task that restores the first holder's file (KFD's RESTORE, or the
//!   GEM BOs of a render file) exports each such BO as a dma-buf, keeps the
//!   fd (above CRIU's fds) and posts its pid and fd number in the slot
//!   ([`Exchange::post`]).
//! * The importing task, restoring its render file, waits for the slot to
//!   be posted and copies the fd out of the holder's table with
//!   `pidfd_getfd` ([`Exchange::take`]), then imports it (`PRIME
//!   FD_TO_HANDLE`) at the recorded handle; it counts itself off the slot.
//!   A KFD file that imported the BO (HIP IPC's importer) takes it the same
//!   way after its RESTORE and imports it with `IMPORT_DMABUF`
//!   ([`super::kfd_import`]).
//! * The holder keeps its fds until every importer took them: it waits in
//!   [`Exchange::wait_taken`] once its files and mappings are restored,
//!   before its restorer runs, so a task never reaches user code while
//!   another still needs its BO.
//!
//! Neither wait is forever: a slot not posted, or not taken, within
//! [`WAIT`] fails the waiting task's restore naming both holders, and CRIU
//! then ends the whole restore before any task runs (patches 0016, 0024).
//! Should criu be killed, every task dies with it and nothing is written to
//! the images.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::SessionError;
use crate::image::{kfd_image_id, render_image_id, FileId, KfdImage, RenderImage};
use crate::os::fd::pidfd_getfd;
use crate::os::futex;
use crate::os::process::{getpid, pidfd_open};
use crate::os::shared::{Shared, SharedState};

/// BOs one restore can hand between processes; a dump with more is
/// refused by the restore before any task exists.
pub const SLOTS: usize = 1024;
/// How long a task waits for the other side of a slot.
pub const WAIT: Duration = Duration::from_secs(120);

/// Slot states: made by criu main, posted by the first holder's task.
const WANTED: u32 = 1;
const POSTED: u32 = 2;

/// One BO another process imports.
#[repr(C)]
struct Slot {
    state: AtomicU32,
    /// The first holder's CRIU file and the BO's index in its image.
    file: AtomicU32,
    index: AtomicU32,
    /// The first holder's pid at dump, for messages.
    holder: AtomicU32,
    /// Files that import it and have not taken it yet.
    takers: AtomicU32,
    /// The posting task's pid (in its own namespace, which the restored
    /// tasks share) and the fd number of the dma-buf there.
    pid: AtomicI32,
    fd: AtomicI32,
}

#[repr(C)]
struct Board {
    used: AtomicU32,
    slots: [Slot; SLOTS],
}

// SAFETY: only atomics, no pointers; all zeroes is an empty board.
unsafe impl SharedState for Board {}

/// The exchange of one restore, mapped shared in criu main before any task
/// exists (every task forked since sees it).
#[derive(Clone, Copy)]
pub struct Exchange {
    board: &'static Board,
}

impl std::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exchange")
            .field("used", &self.board.used.load(Ordering::Relaxed))
            .finish()
    }
}

/// A BO of the dump by its first holder: CRIU file, index in its image.
pub type Key = (FileId, u32);

/// The BOs the render and KFD images in `dir` import from another
/// process (a render image's `same_bo_pid` entries, a KFD image's
/// `criu_rocm_imports`): (first holder, its pid at dump) and how many files
/// import each, in key order.  `Err`: an image that does not read (the
/// validation before has named it).
pub fn imports_in(dir: &Path) -> std::io::Result<Vec<(Key, u32, u32)>> {
    let mut out: std::collections::BTreeMap<Key, (u32, u32)> = Default::default();
    let bad = |e: crate::image::ImageError| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
    };
    for e in std::fs::read_dir(dir)? {
        let name = e?.file_name();
        let name = name.to_str().unwrap_or_default();
        let links: Vec<(u32, u32, u32)> = if let Some(id) = render_image_id(name) {
            let img = RenderImage::read(dir, id).map_err(bad)?;
            img.msg
                .bo_entries
                .iter()
                .filter_map(|b| Some((b.same_bo_file?, b.same_bo_index?, b.same_bo_pid?)))
                .collect()
        } else if let Some(id) = kfd_image_id(name) {
            let img = KfdImage::read(dir, id).map_err(bad)?;
            img.msg
                .criu_rocm_imports
                .iter()
                .map(|i| (i.same_bo_file, i.same_bo_index, i.same_bo_pid))
                .collect()
        } else {
            continue;
        };
        for (file, index, pid) in links {
            out.entry((FileId(file), index)).or_insert((pid, 0)).1 += 1;
        }
    }
    Ok(out.into_iter().map(|(k, (pid, n))| (k, pid, n)).collect())
}

impl Exchange {
    /// In criu main: the exchange for the images in `dir`, `None` when no
    /// process imports another's BO.  `Err`: the reason, for the log.
    pub fn create(dir: &Path) -> Result<Option<Exchange>, String> {
        let imports = imports_in(dir).map_err(|e| format!("reading the GPU images: {e}"))?;
        if imports.is_empty() {
            return Ok(None);
        }
        if imports.len() > SLOTS {
            return Err(format!(
                "the images hold {} BOs imported by another process than their first holder's; \
                 one restore hands over at most {SLOTS}",
                imports.len()
            ));
        }
        let board = Shared::<Board>::create(c"criu-rocm-bo-exchange")
            .map_err(|e| format!("mapping the BO exchange: {e}"))?
            .leak();
        for (s, ((file, index), holder, takers)) in board.slots.iter().zip(&imports) {
            s.file.store(file.0, Ordering::Relaxed);
            s.index.store(*index, Ordering::Relaxed);
            s.holder.store(*holder, Ordering::Relaxed);
            s.takers.store(*takers, Ordering::Relaxed);
            s.state.store(WANTED, Ordering::Release);
        }
        board.used.store(imports.len() as u32, Ordering::Release);
        log::info!(
            "{} BO(s) are held by files of two processes: the first holder's task hands each \
             to the importing one's",
            imports.len()
        );
        Ok(Some(Exchange { board }))
    }

    fn used(&self) -> &[Slot] {
        let n = self.board.used.load(Ordering::Acquire) as usize;
        &self.board.slots[..n.min(SLOTS)]
    }

    /// The slots of the BOs of file `file` other processes import: (slot,
    /// index of the BO in the file's image).
    pub fn wanted_of(&self, file: FileId) -> Vec<(usize, u32)> {
        self.used()
            .iter()
            .enumerate()
            .filter(|(_, s)| s.file.load(Ordering::Relaxed) == file.0)
            .map(|(i, s)| (i, s.index.load(Ordering::Relaxed)))
            .collect()
    }

    /// In the task that restored the first holder's file: the dma-buf
    /// `fd` of the BO of slot `slot` is ready to take (the task keeps `fd`
    /// open until [`Self::wait_taken`]).
    pub fn post(&self, slot: usize, fd: RawFd) {
        let s = &self.board.slots[slot];
        s.pid.store(getpid(), Ordering::Relaxed);
        s.fd.store(fd, Ordering::Relaxed);
        s.state.store(POSTED, Ordering::Release);
        futex::wake(&s.state);
    }

    /// In an importing task (pid `vpid`): a dma-buf of BO `key`, once the
    /// task restoring its first holder posted it; `what` names the
    /// importing file and handle for a refusal.
    pub fn take(&self, vpid: i32, key: Key, what: &str) -> Result<OwnedFd, SessionError> {
        let slot = self.slot(key);
        let fail = |why: String| SessionError::State {
            pid: vpid,
            what: format!("{what}: {why}"),
        };
        let s = slot.ok_or_else(|| {
            fail("the restore has no exchange slot for it (criu main did not see it)".into())
        })?;
        let holder = s.holder.load(Ordering::Relaxed);
        let start = Instant::now();
        while s.state.load(Ordering::Acquire) != POSTED {
            if start.elapsed() > WAIT {
                return Err(fail(format!(
                    "the restore of pid {holder}, which holds it first, did not hand it over \
                     within {} s",
                    WAIT.as_secs()
                )));
            }
            futex::wait(&s.state, WANTED, Duration::from_millis(100));
        }
        let (pid, fd) = (s.pid.load(Ordering::Relaxed), s.fd.load(Ordering::Relaxed));
        let got = pidfd_open(pid).and_then(|p| pidfd_getfd(p.as_fd(), fd));
        let dmabuf = got.map_err(|e| {
            fail(format!(
                "taking the dma-buf of pid {holder}'s restored BO (fd {fd} of task {pid}): {e}"
            ))
        })?;
        self.count_off(key);
        Ok(dmabuf)
    }

    /// An importing file took BO `key` without the exchange (its first
    /// holder's file was restored in the same task): one taker fewer.
    pub fn count_off(&self, key: Key) {
        if let Some(s) = self.slot(key) {
            // Never below zero, whatever the images claim.
            let _ = s
                .takers
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
            futex::wake(&s.takers);
        }
    }

    fn slot(&self, (file, index): Key) -> Option<&Slot> {
        self.used().iter().find(|s| {
            s.file.load(Ordering::Relaxed) == file.0 && s.index.load(Ordering::Relaxed) == index
        })
    }

    /// In the task that posted slot `slot`: waits until every importing
    /// file took the BO, so that the task may close its fd.
    pub fn wait_taken(&self, vpid: i32, slot: usize) -> Result<(), SessionError> {
        let s = &self.board.slots[slot];
        let start = Instant::now();
        loop {
            let left = s.takers.load(Ordering::Acquire);
            if left == 0 {
                return Ok(());
            }
            if start.elapsed() > WAIT {
                return Err(SessionError::State {
                    pid: vpid,
                    what: format!(
                        "BO {} of file {} is imported by {left} file(s) of other processes whose \
                         restore did not take it within {} s",
                        s.index.load(Ordering::Relaxed),
                        s.file.load(Ordering::Relaxed),
                        WAIT.as_secs()
                    ),
                });
            }
            futex::wait(&s.takers, left, Duration::from_millis(100));
        }
    }
}

/// The dma-bufs a task posted, kept open until taken.
#[derive(Debug, Default)]
pub struct Posted(Vec<(usize, OwnedFd)>);

impl Posted {
    /// Posts, for each BO of file `file` another process imports, the
    /// dma-buf `export(index)` gives, numbered `fd_floor` or above.
    pub fn post_file(
        &mut self,
        ex: &Exchange,
        vpid: i32,
        file: FileId,
        fd_floor: RawFd,
        mut export: impl FnMut(u32) -> Result<OwnedFd, SessionError>,
    ) -> Result<(), SessionError> {
        for (slot, index) in ex.wanted_of(file) {
            let fd = export(index)?;
            let fd = crate::os::fd::dup_at_least(fd.as_fd(), fd_floor).map_err(|source| {
                SessionError::Os {
                    pid: vpid,
                    step: format!("keeping the dma-buf of BO {index} of file {file}"),
                    source,
                }
            })?;
            ex.post(slot, fd.as_raw_fd());
            log::info!(
                "pid {vpid}: BO {index} of file {file} handed to the process that imports it"
            );
            self.0.push((slot, fd));
        }
        Ok(())
    }

    /// Waits until every importer took what this task posted, then closes
    /// the fds.
    pub fn finish(&mut self, ex: &Exchange, vpid: i32) -> Result<(), SessionError> {
        for (slot, _) in &self.0 {
            ex.wait_taken(vpid, *slot)?;
        }
        self.0.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn board() -> Exchange {
        let board = Shared::<Board>::create(c"test-bo-exchange").unwrap().leak();
        let s = &board.slots[0];
        s.file.store(7, Ordering::Relaxed);
        s.index.store(2, Ordering::Relaxed);
        s.holder.store(40, Ordering::Relaxed);
        s.takers.store(1, Ordering::Relaxed);
        s.state.store(WANTED, Ordering::Release);
        board.used.store(1, Ordering::Release);
        Exchange { board }
    }

    #[test]
    fn a_posted_dma_buf_is_taken_once_and_the_holder_lets_go() {
        let ex = board();
        assert_eq!(ex.wanted_of(FileId(7)), vec![(0, 2)]);
        assert!(ex.wanted_of(FileId(8)).is_empty());
        let mut posted = Posted::default();
        let memfd = crate::os::fd::memfd(c"stand-in").unwrap();
        let stand_in: OwnedFd = memfd.into();
        posted
            .post_file(&ex, 1, FileId(7), 100, |i| {
                assert_eq!(i, 2);
                Ok(stand_in.try_clone().unwrap())
            })
            .unwrap();
        let got = ex.take(1, (FileId(7), 2), "file 9, GEM handle 1").unwrap();
        assert!(crate::os::fd::same_open_file(got.as_fd(), stand_in.as_fd()).unwrap());
        posted.finish(&ex, 1).unwrap();
    }

    #[test]
    fn an_unknown_bo_names_the_importer() {
        let ex = board();
        let e = ex
            .take(5, (FileId(7), 3), "render-node file 9, GEM handle 1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("render-node file 9, GEM handle 1"), "{e}");
    }
}
